"""TTFT of a resumed session (KV state read from disk) against re-reading its history.

A long conversation (turns cut from the Declaration of Independence, ~HISTORY tokens) is
prefilled once and its KV state saved to a file with `export_state` (what the server's
`/v1/sessions` writes after every turn). Then, in alternating order each round, on a
cache emptied by an unrelated prompt:
- resumed: read the file, `import_state` it into a slot, ask the next question;
- re-prefill: ask the same next question with nothing cached (what happens without
  sessions, or after a restart without them).
TTFT is measured from before the file is read (resumed) or before the request
(re-prefill) to the first token. The greedy first tokens must agree.

With `--server`, the same through a real `inferenceos serve` (one slot): each round a
new session gets the long history as its first message (its state saved to disk), an
unrelated request empties the slot, then the session's next message (restored from
disk) races the same conversation sent whole to /v1/chat/completions (after emptying
the slot again). TTFT is the time to the first streamed piece, as a client sees it.

    .venv/bin/python benchmarks/sessions.py [--model PATH] [--history 2000]
        [--threads 2] [--rounds 5] [--server]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import inferenceos

DATA = Path(__file__).resolve().parent / "data" / "declaration_of_independence.txt"


def conversation(model: inferenceos.Model, history_tokens: int) -> list[dict[str, str]]:
    """User turns of ~150 tokens with short replies, until ~history_tokens."""
    words = DATA.read_text(encoding="utf-8").split()
    msgs: list[dict[str, str]] = []
    i = 0
    while len(model.tokenize(model.chat_prompt(msgs or [{"role": "user", "content": ""}]))) \
            < history_tokens:
        chunk = " ".join(words[i % len(words): i % len(words) + 110])
        i += 110
        msgs += [{"role": "user", "content": f"Remember this passage: {chunk}"},
                 {"role": "assistant", "content": "Noted."}]
    return msgs


def first_token(model: inferenceos.Model, prompt: list[int]) -> tuple[int, float]:
    """(first token id, TTFT in seconds as the engine measured it)."""
    gen = model.engine.generate(prompt, inferenceos.api.sampling_params(
        {"temperature": 0, "max_tokens": 1}))
    tokens = [ev.token for ev in gen if ev.token >= 0]
    return tokens[0], gen.metrics.ttft_s


def evict(model: inferenceos.Model) -> None:
    """Give the slot to an unrelated prompt: nothing of the history stays cached."""
    model.generate("Zebras.", max_tokens=1, temperature=0)


def _stream_ttft(url: str, body: dict, key: str) -> float:
    """Seconds from the request to the first streamed piece of text."""
    import json
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as resp:
        for raw in resp:
            line = raw.decode().removeprefix("data: ").strip()
            if line and line != "[DONE]":
                piece = json.loads(line)
                if key == "delta" and piece.get("delta"):
                    return time.perf_counter() - t0
                if key == "choices" and piece["choices"] and piece["choices"][0]["delta"].get(
                        "content"):
                    return time.perf_counter() - t0
    raise RuntimeError("no text came back")


def server_rounds(args: argparse.Namespace) -> None:
    """The --server mode (see the module docstring)."""
    import json
    import os
    import socket
    import subprocess
    import urllib.request

    from inferenceos.model.default_model import ensure_default_model

    model = Path(args.model) if args.model else ensure_default_model()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = f"http://127.0.0.1:{port}"

    def post(path: str, body: dict) -> dict:
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as resp:
            return dict(json.loads(resp.read()))

    words = DATA.read_text(encoding="utf-8").split()
    history = "Remember this text: " + " ".join(words[: int(args.history * 0.75)])
    question = "Which grievance came first? Answer briefly."
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "INFERENCEOS_HOME": home}
        server = subprocess.Popen(
            [sys.executable, "-m", "inferenceos", "serve", str(model), "--port", str(port),
             "--parallel", "1", "--threads", str(args.threads), "--ctx",
             str(args.history + 512)], env=env, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen(base + "/health", timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.2)
            name = ""  # the server's default model
            sessions, fresh, ratios = [], [], []
            for r in range(args.rounds):
                sid = post("/v1/sessions", {"model": name})["id"]
                first = post(f"/v1/sessions/{sid}/messages", {"content": history,
                                                              "max_tokens": 4, "temperature": 0})
                msgs = [{"role": "user", "content": history},
                        first["message"], {"role": "user", "content": question}]
                times = {}
                for mode in (("session", "chat") if r % 2 == 0 else ("chat", "session")):
                    post("/v1/completions", {"prompt": "Zebras.", "max_tokens": 1})  # evict
                    if mode == "session":
                        times[mode] = _stream_ttft(
                            f"{base}/v1/sessions/{sid}/messages",
                            {"content": question, "max_tokens": 4, "temperature": 0}, "delta")
                    else:
                        times[mode] = _stream_ttft(
                            f"{base}/v1/chat/completions",
                            {"model": name, "messages": msgs, "max_tokens": 4,
                             "temperature": 0}, "choices")
                sessions.append(times["session"])
                fresh.append(times["chat"])
                ratios.append(times["chat"] / times["session"])
                print(f"round {r}: session turn {times['session'] * 1000:.0f} ms, whole "
                      f"conversation {times['chat'] * 1000:.0f} ms, x{ratios[-1]:.1f} "
                      f"(history {first['usage']['prompt_tokens']} tokens)")
        finally:
            server.terminate()
            server.wait(30)
    print(f"server, median TTFT: session {statistics.median(sessions) * 1000:.0f} ms, "
          f"re-prefill {statistics.median(fresh) * 1000:.0f} ms; median paired speed-up "
          f"x{statistics.median(ratios):.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="", help="GGUF path (default: built-in Gemma)")
    ap.add_argument("--history", type=int, default=2000, help="history tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--server", action="store_true", help="through a real `serve`")
    args = ap.parse_args()
    if args.server:
        server_rounds(args)
        return
    with inferenceos.load(args.model, n_ctx=args.history + 512, threads=args.threads) as model:
        msgs = conversation(model, args.history)
        history = model.tokenize(model.chat_prompt(msgs))
        question = [*msgs, {"role": "user", "content": "Which grievance came first?"}]
        prompt = model.tokenize(model.chat_prompt(question))
        assert prompt[: len(history) - 8] == history[: len(history) - 8]
        first_token(model, history)  # the history's turn: its KV cells now in the slot
        saved = model.engine.export_state(history)
        assert saved is not None
        tokens, data = saved
        with tempfile.TemporaryDirectory() as tmp:
            state_file = Path(tmp) / "state.bin"
            state_file.write_bytes(data)
            print(f"model {model.path.name}: history {len(history)} tokens, question "
                  f"{len(prompt) - len(tokens)} new tokens, state {len(data) / 2**20:.1f} MiB, "
                  f"{args.threads} threads")
            resumed, fresh, ratios = [], [], []
            for r in range(args.rounds):
                times: dict[str, float] = {}
                firsts: dict[str, int] = {}
                for mode in (("resume", "prefill") if r % 2 == 0 else ("prefill", "resume")):
                    evict(model)
                    t0 = time.perf_counter()
                    if mode == "resume":
                        n = model.engine.import_state(tokens, state_file.read_bytes())
                        assert n == len(tokens)
                    tok, _ = first_token(model, prompt)
                    times[mode] = time.perf_counter() - t0
                    firsts[mode] = tok
                if firsts["resume"] != firsts["prefill"]:
                    print(f"round {r}: first tokens differ ({firsts})", file=sys.stderr)
                resumed.append(times["resume"])
                fresh.append(times["prefill"])
                ratios.append(times["prefill"] / times["resume"])
                print(f"round {r}: resumed {times['resume'] * 1000:.0f} ms, re-prefill "
                      f"{times['prefill'] * 1000:.0f} ms, x{ratios[-1]:.1f}")
    print(f"median TTFT: resumed {statistics.median(resumed) * 1000:.0f} ms, re-prefill "
          f"{statistics.median(fresh) * 1000:.0f} ms; median paired speed-up "
          f"x{statistics.median(ratios):.1f} (best rounds: {min(resumed) * 1000:.0f} vs "
          f"{min(fresh) * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
