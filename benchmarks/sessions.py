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

    .venv/bin/python benchmarks/sessions.py [--model PATH] [--history 2000]
        [--threads 2] [--rounds 5]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="", help="GGUF path (default: built-in Gemma)")
    ap.add_argument("--history", type=int, default=2000, help="history tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
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
