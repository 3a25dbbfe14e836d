"""Ctrl-C at random moments: every stop within a second, exit 130, no traceback.

Sends SIGINT at seeded random moments into real CLI processes and checks each one:

- `run` on the tiny model and on Gemma, drafting on (`--draft ngram`) and off, with a
  long prompt (so moments land in importing, planning and loading, prefilling, decoding);
- `chat` on both models, its message arriving on a pipe (a script's chat: Ctrl-C ends
  it; at a terminal it stops the reply and the chat goes on, tests/cli/test_chat_cli.py);
- `serve MODEL --pin MODEL`, which loads its pinned model before it listens: a moment
  before the listen line must end it as the CLI does (130, one line), one after it is a
  shutdown (uvicorn's, exit 0; 130 in the instant before uvicorn holds the signals),
  within the same second.

A moment is `uniform(0.05, --late)` seconds after the process starts (for serve at most
3 s: by then it has loaded and listens). For each stop the
phase it landed in is read from what the process had printed by then (nothing yet:
importing; the plan line: loading and prefilling; the first token or the chat's reply:
generating), so the table shows the phases the moments covered. A process that had ended
before its moment is counted apart, not as a stop.

    .venv/bin/python benchmarks/interrupt.py [--n 200] [--late 8] [--seed 46]
        [--parallel 2] [--only run|chat|serve]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tiny model writer

STOP_WITHIN_S = 1.0
LISTENING = b"InferenceOS API on"
SERVE_LATE = 3.0
REGISTERED = {"tiny": "tiny-wide", "gemma": "gemma-bench"}  # serve pins a registry name


def _long_prompt(chapters: int) -> str:
    return " ".join(f"Chapter {i}: the dragon flew over the mountains and the old town."
                    for i in range(chapters)) + " Now write a very long story about the dragon."


@dataclass(frozen=True)
class Case:
    """One kind of process to interrupt."""

    command: str  # run, chat or serve
    model: str  # tiny or gemma
    draft: bool

    @property
    def label(self) -> str:
        return f"{self.command} {self.model}" + (" draft" if self.draft else "")


@dataclass
class Watched:
    """A child process and when its output first showed each phase."""

    proc: subprocess.Popen[bytes]
    started: float
    seen: dict[str, float] = field(default_factory=dict)
    err: bytearray = field(default_factory=bytearray)

    def read(self, stream: str, marker: bytes | None) -> None:
        pipe = getattr(self.proc, stream)
        buf = bytearray()
        while chunk := os.read(pipe.fileno(), 4096):
            now = time.monotonic()
            buf += chunk
            self.seen.setdefault(stream, now)
            if marker is not None and marker in buf:
                self.seen.setdefault("marker", now)
            if stream == "stderr":
                self.err += chunk


@dataclass(frozen=True)
class Stop:
    case: Case
    moment: float
    phase: str
    took: float  # seconds from SIGINT to exit (inf: still running after 20 s)
    code: int
    stderr: str

    def problem(self) -> str | None:
        """What is wrong with this stop, or None."""
        # after the listen line uvicorn's drain ends it with 0; in the moment between
        # that line and uvicorn taking the signals over, the CLI's one line and 130
        want = (0, 130) if self.phase == "listening" else (130,)
        if self.code not in want:
            return f"exit {self.code}"
        if "Traceback" in self.stderr or "Exception ignored" in self.stderr:
            return "traceback"
        if self.took > STOP_WITHIN_S:
            return f"took {self.took:.2f} s"
        return None


def command_for(case: Case, model: Path, prompt: str) -> list[str]:
    base = [sys.executable, "-m", "inferenceos"]
    if case.command == "run":
        cmd = [*base, "run", str(model), "-p", prompt, "-n", "100000", "--ctx", "4096",
               "--threads", "1", "--ignore-eos"]
    elif case.command == "chat":
        cmd = [*base, "chat", str(model), "--local", "--ctx", "4096", "--threads", "1"]
    else:
        from inferenceos.cluster.spawn import free_port

        name = REGISTERED[case.model]
        cmd = [*base, "serve", name, "--pin", name, "--port", str(free_port()),
               "--ctx", "4096", "--threads", "1"]
    return cmd + (["--draft", "ngram"] if case.draft else [])


def phase_of(case: Case, w: Watched, sent: float) -> str:
    """Where the process was when the signal was sent, from what it had printed."""
    def before(key: str) -> bool:
        return key in w.seen and w.seen[key] <= sent

    if case.command == "serve":
        return "listening" if before("marker") else "loading" if before("stderr") \
            else "importing"
    if case.command == "chat":
        return "replying" if before("marker") else "loading" if before("stdout") \
            else "importing"
    return "generating" if before("stdout") else "loading" if before("stderr") \
        else "importing"


def interrupt_once(case: Case, model: Path, prompt: str, moment: float, env: dict[str, str],
                   ) -> Stop | None:
    """SIGINT `moment` s after the start; None when the process had ended by then."""
    proc = subprocess.Popen(command_for(case, model, prompt), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    w = Watched(proc, time.monotonic())
    # the chat's reply follows its prompt ">>> " on stdout; serve's listen line is on stderr
    markers = {"stdout": b">>> " if case.command == "chat" else None,
               "stderr": LISTENING if case.command == "serve" else None}
    readers = [threading.Thread(target=w.read, args=(s, m), daemon=True)
               for s, m in markers.items()]
    for t in readers:
        t.start()
    assert proc.stdin is not None
    if case.command == "chat":
        proc.stdin.write(prompt.encode() + b"\n")
        proc.stdin.flush()  # and kept open: at EOF the chat would end by itself
    time.sleep(max(0.0, w.started + moment - time.monotonic()))
    if proc.poll() is not None:
        return None
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
        took = time.monotonic() - sent
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        took = float("inf")
    for t in readers:
        t.join(5)
    proc.stdin.close()
    return Stop(case, moment, phase_of(case, w, sent), took, proc.returncode,
                w.err.decode(errors="replace"))


def cases(only: str | None) -> list[Case]:
    every = [Case("run", m, d) for m in ("tiny", "gemma") for d in (False, True)]
    every += [Case("chat", m, False) for m in ("tiny", "gemma")]
    every += [Case("serve", m, False) for m in ("tiny", "gemma")]
    return [c for c in every if only in (None, c.command)]


def models() -> dict[str, Path]:
    from inferenceos.model.default_model import ensure_default_model
    from tiny_models import write_tiny_model

    tiny = Path(tempfile.mkdtemp(prefix="interrupt-bench-")) / "tiny-wide.gguf"
    return {"tiny": write_tiny_model(tiny, "wide"), "gemma": ensure_default_model()}


def report(stops: list[Stop], ended_first: Counter[str]) -> int:
    by_case: dict[str, list[Stop]] = {}
    for s in stops:
        by_case.setdefault(s.case.label, []).append(s)
    print(f"\n{'case':<18} {'stops':>5}  {'phases':<44} {'max s':>6}  bad")
    for label, group in by_case.items():
        phases = Counter(s.phase for s in group)
        shown = ", ".join(f"{k} {v}" for k, v in sorted(phases.items()))
        slowest = max(s.took for s in group)
        bad = sum(s.problem() is not None for s in group)
        extra = f"  ({ended_first[label]} ended before the moment)" if ended_first[label] \
            else ""
        print(f"{label:<18} {len(group):>5}  {shown:<44} {slowest:6.2f}  {bad}{extra}")
    problems = [s for s in stops if s.problem() is not None]
    for s in problems:
        print(f"  {s.case.label} at {s.moment:.2f} s ({s.phase}): {s.problem()}\n"
              f"    {s.stderr.strip()[-600:]}")
    took = sorted(s.took for s in stops)
    p99 = took[min(len(took) - 1, int(0.99 * len(took)))] if took else 0.0
    print(f"\n{len(stops)} stops, {len(problems)} bad; SIGINT to exit: median "
          f"{took[len(took) // 2] if took else 0:.2f} s, p99 {p99:.2f} s, max "
          f"{took[-1] if took else 0:.2f} s; load average {os.getloadavg()[0]:.2f}")
    return 1 if problems else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200, help="moments in all")
    ap.add_argument("--late", type=float, default=8.0, help="latest moment (s)")
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--parallel", type=int, default=2, help="processes at a time")
    ap.add_argument("--only", choices=("run", "chat", "serve"))
    args = ap.parse_args()
    paths = models()
    prompts = {"gemma": _long_prompt(80), "tiny": _long_prompt(40)}
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"),
           "INFERENCEOS_HOME": tempfile.mkdtemp(prefix="interrupt-home-")}
    for which, path in paths.items():  # for serve --pin
        subprocess.run([sys.executable, "-m", "inferenceos", "pull", str(path), "--name",
                        REGISTERED[which], "--link"], env=env, check=True,
                       capture_output=True)
    rng = random.Random(args.seed)
    # serve has loaded its pinned model within ~3 s: its moments are drawn up to there
    todo = [(c, rng.uniform(0.05, min(args.late, SERVE_LATE) if c.command == "serve"
                            else args.late))
            for c in cases(args.only) * args.n][: args.n]
    stops: list[Stop] = []
    ended_first: Counter[str] = Counter()
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if not todo:
                    return
                case, moment = todo.pop()
            stop = interrupt_once(case, paths[case.model], prompts[case.model], moment, env)
            with lock:
                if stop is None:
                    ended_first[case.label] += 1
                else:
                    stops.append(stop)
                    mark = "." if stop.problem() is None else "F"
                    print(mark, end="", flush=True)

    workers = [threading.Thread(target=work) for _ in range(args.parallel)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return report(stops, ended_first)


if __name__ == "__main__":
    sys.exit(main())
