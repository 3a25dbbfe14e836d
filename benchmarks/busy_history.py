"""Predictions after a busy hour: three runs recorded beside a CPU-burning neighbour,
then the prediction for the machine without it, against a measurement without it.

A fresh data dir (benchmarks/learning.py's Runner and its temporary data dir); the
built-in Gemma 3 270M at a fixed thread count (every usable core, so the neighbour
really takes from the run). Steps: (1) a pure-Python busy loop starts; three runs are
recorded with the contention the recorder samples (`contention="sample"`); it stops.
(2) `simulate` predicts decode and prefill for the quiet machine: with the contention
correction (plan.calibration.core_share) and, for contrast, from the same runs taken as
measured (the fit before issue 26). (3) three unrecorded runs measure the truth.
Target: the corrected prediction within 15 %. The data dir's first prediction comes in
the busy hour, as a user's might, so it calibrates itself beside the neighbour and
redoes that probe at the quiet prediction (plan/calibration_load.self_calibrate).

On a machine others share, "quiet" only means without our neighbour: the prediction is
also slowed by what the others take at that moment (simulate at fixed threads).

    PYTHONPATH=src .venv/bin/python benchmarks/busy_history.py [--tokens 48]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]

import learning  # noqa: E402, I001  (sets a fresh data dir before inferenceos is imported)

from inferenceos import telemetry  # noqa: E402
from inferenceos.model.default_model import ensure_default_model  # noqa: E402
from inferenceos.plan.calibration_load import self_calibrate  # noqa: E402

BUSY = "while True:\n    pass\n"


class BusyRunner(learning.Runner):
    """learning.Runner whose recorded runs carry the sampled CPU contention."""

    contention: object = "sample"

    def run(self, record: bool = True) -> tuple[float, float]:
        if not record:
            return super().run(record=False)
        from inferenceos.engine.sampling import SamplingParams
        from inferenceos.engine.scheduler import generate_one

        sp = SamplingParams(temperature=0.0, max_tokens=self.tokens, ignore_eos=True)
        for _ in generate_one(self.lm, self.prompt, sp, adaptive_threads=False):
            pass
        m, s = self.lm.metrics, self.settings
        telemetry.recorder().generation(
            self.path, source="benchmark:busy",
            settings={"n_threads": s.n_threads, "n_ctx": s.n_ctx, "n_batch": s.n_batch,
                      "n_ubatch": s.n_ubatch, "flash_attn": s.flash_attn},
            prompt_tokens=m.prompt_tokens, output_tokens=m.completion_tokens,
            prefill_tps=m.prompt_tps, decode_tps=m.decode_tps, ttft_s=m.ttft_s,
            threads=s.n_threads, n_ctx=s.n_ctx, n_batch=s.n_batch, n_ubatch=s.n_ubatch,
            extra={"model_path": str(self.path)}, contention=self.contention,
        )
        telemetry.recorder().flush(timeout=10)
        return m.prompt_tps, m.decode_tps


def _predict(path: Path, prompt: int, tokens: int, threads: int) -> learning.Prediction:
    """What `simulate` predicts: first the data dir calibrates itself if it never did
    (or redoes a probe timed beside busy CPUs, now that they are quiet), as simulate's
    machine options do (cli/simulate_cmd.options_machine)."""
    self_calibrate(lambda line: print(line, flush=True))
    return learning.predict(path, prompt, tokens, threads)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args()
    gemma = ensure_default_model()
    threads = len(os.sched_getaffinity(0))
    burner = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(1.0)
        # the data dir's first prediction, in the busy hour: it calibrates (beside the
        # neighbour, so the probe is redone once the machine is quiet)
        pred0 = _predict(gemma, args.prompt, args.tokens, threads)
        r = BusyRunner(gemma, pred0, args.prompt, args.tokens)
        busy = [r.run() for _ in range(3)]
    finally:
        burner.kill()
        burner.wait()
    rows = telemetry.generations(source="benchmark:busy")
    shares = [row.extra.get("contention", {}).get("busy_others") for row in rows]
    print(f"busy runs: decode {[round(b[1], 1) for b in busy]} t/s, other processes busy "
          f"on {shares} CPUs (sampled after each run), {threads} threads")
    time.sleep(2.0)
    corrected = _predict(gemma, args.prompt, args.tokens, threads)
    truth = r.truth(3)
    print(f"{'':34} | decode pred/meas        | prefill pred/meas        | basis")
    learning.row("after 3 busy runs, corrected", corrected, truth)
    # the same history without its contention: what the fit did before
    from inferenceos.telemetry import db as tdb

    conn = tdb.open_db(tdb.db_path())
    with conn:
        conn.execute("UPDATE generations SET extra = json_remove(extra, '$.contention')")
    conn.close()
    plain = _predict(gemma, args.prompt, args.tokens, threads)
    learning.row("same runs, contention ignored", plain, truth)
    print(f"load average {Path('/proc/loadavg').read_text().split()[0]}")
    r.close()


if __name__ == "__main__":
    main()
