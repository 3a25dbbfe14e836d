"""A worker whose parent went away while it loaded leaves quietly.

`serve` stopped by a Ctrl-C while it loads a pinned model closes the worker's pipe; the
worker, still loading, used to finish and print a BrokenPipeError traceback from
`conn.send([Ready(...)])` onto the terminal it shares with its parent
(benchmarks/interrupt.py found it: 7 of 25 moments in a load)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from cli_helpers import cli_env

_CHILD = textwrap.dedent("""
    import sys
    from multiprocessing import Pipe
    from pathlib import Path
    from inferenceos.engine.worker.main import WorkerConfig, worker_main
    from inferenceos.plan.llama_params import LlamaParams

    parent, child = Pipe()
    parent.close()  # the parent has gone before the load ends
    worker_main(child, WorkerConfig(Path(sys.argv[1]), LlamaParams(n_ctx=256, n_threads=1)))
    print("left")
""")


def test_a_worker_whose_parent_left_during_its_load_exits_quietly(tiny_llama: Path) -> None:
    r = subprocess.run([sys.executable, "-c", _CHILD, str(tiny_llama)], capture_output=True,
                       text=True, timeout=120, env=cli_env())
    assert (r.returncode, r.stdout.strip()) == (0, "left"), r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr
