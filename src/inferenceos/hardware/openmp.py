"""How llama.cpp's OpenMP threads wait: set before the library (and libgomp) is loaded.

llama-cpp-python's CPU backend is built with OpenMP, and ggml's barrier between two ops
of a graph *is* `#pragma omp barrier` (ggml-cpu.c, `ggml_barrier`). libgomp decides how
a thread waits at a barrier and between parallel regions from its environment, read
once when the library loads:

- its default spins `GOMP_SPINCOUNT` = 300,000 rounds (several milliseconds on current
  x86) before sleeping. Between two graph computes that keeps idle threads on the cores
  for longer than a whole decode step of a small model: a process that waits for
  another on the same machine (an RPC worker while the client computes, the client
  while a worker computes) takes the cores the other needs.
- `OMP_WAIT_POLICY=PASSIVE` sleeps at once, also at every op barrier inside a graph: a
  futex wake-up per op. Gemma 3 270M decoded at about half speed that way (48.8 t/s
  against 95 locally; an RPC worker's layers likewise).

`bounded_spin` sets a spin count between the two: long enough to cover the waits inside
a graph (an op's thread imbalance: microseconds), short enough that a thread whose
graph has ended sleeps within a fraction of a millisecond. The user's own
`OMP_WAIT_POLICY` or `GOMP_SPINCOUNT` always wins.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

# spins of libgomp's wait loop (one `pause` each: ~20-40 ns on current x86 cores), so
# ~0.2-0.4 ms. Measured on Gemma over two loopback workers: docs/cluster.md.
SPIN_COUNT = "10000"
USER_KNOBS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def bounded_spin(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set `GOMP_SPINCOUNT` in `environ` (default: this process's) unless the user set
    a wait policy or spin count; True when it was set. Has effect only before libgomp is
    loaded in the process (or for child processes started with that environment)."""
    env = os.environ if environ is None else environ
    if any(k in env for k in USER_KNOBS):
        return False
    env["GOMP_SPINCOUNT"] = SPIN_COUNT
    return True
