"""Would llama.cpp load this file? Asked of llama.cpp itself, in a child process.

`models pull` runs this before a model appears in the registry, so a file llama.cpp
cannot load (unknown architecture, a missing or misshapen tensor) is refused at pull time
with llama.cpp's own reason instead of failing at the first request.

The check is a `no_alloc` dry load (`load_mode = NONE`: no mmap, no tensor data read, no
buffers allocated; see design.md): llama.cpp reads the architecture, hyper-parameters,
vocabulary and every tensor's name and shape, and refuses what it would refuse in a real
load. It runs in a child process because a malformed file can make llama.cpp abort(),
which would otherwise end the CLI or the server. Cost: a Python start and the library
load (0.5 s) plus reading the header and vocabulary: 0.2 s in all for a tiny model,
1.8 s for Gemma 3 270M (its 262k-token vocabulary dominates; as fast as a vocab-only
load, so no tensor data is read), whatever the size of the weights.

Child protocol: `python -m inferenceos.registry.loadcheck PATH` prints one JSON line,
`{"ok": true}` or `{"ok": false, "reason": "..."}`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from inferenceos.errors import ModelLoadError

TIMEOUT_S = 300.0
# llama.cpp's "llama_model_load: error loading model: " in front of every cause
_PREFIX = re.compile(r"^(?:[a-z_]+: )?(?:error loading model: )?")


def check_loadable(path: Path, timeout: float = TIMEOUT_S) -> None:
    """Return when llama.cpp can load `path`; ModelLoadError with its reason otherwise.

    The reason never holds `path` itself (it may reach an API client).
    """
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])  # the folder that holds inferenceos/
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "inferenceos.registry.loadcheck", str(path)],
            capture_output=True, text=True, timeout=timeout, env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise ModelLoadError(
            f"llama.cpp did not finish checking the model within {timeout:g} s"
        ) from None
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        raise ModelLoadError(f"llama.cpp crashed while reading the model ({name}); "
                             "the file is damaged or uses a format this llama.cpp lacks")
    answer = _last_json(proc.stdout)
    if answer is None:
        tail = " ".join(proc.stderr.split()[-30:])
        raise ModelLoadError(f"the llama.cpp load check failed: {_scrub(tail, path)}")
    if not answer.get("ok"):
        reason = _scrub(str(answer.get("reason") or "unknown reason"), path)
        raise ModelLoadError(f"llama.cpp cannot load this model: {reason}")


def _last_json(stdout: str) -> dict[str, object] | None:
    for line in reversed(stdout.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _scrub(text: str, path: Path) -> str:
    for form in {str(path), str(Path(path).resolve())}:
        text = text.replace(form, Path(path).name)
    return text


def probe(path: Path) -> str | None:
    """In this process: None when llama.cpp dry-loads `path`, else its reason."""
    from inferenceos.engine.llama.lib import lib, log
    from inferenceos.engine.llama.structs import file_check_params

    ll = lib()
    mark = log().mark()
    # a no_alloc dry load on the CPU: llama_structs builds every llama.cpp params struct
    model = ll.llama_model_load_from_file(str(path).encode(), file_check_params())
    if not model:
        errors = log().errors_since(mark)
        # llama.cpp logs the cause first, then "failed to load model"
        causes = [e for e in errors if "failed to load model" not in e] or errors
        return "; ".join(_PREFIX.sub("", c) for c in causes[-2:]) or "unknown reason"
    ll.llama_model_free(model)
    return None


def _main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m inferenceos.registry.loadcheck PATH")
    reason = probe(Path(sys.argv[1]))
    answer = {"ok": True} if reason is None else {"ok": False, "reason": reason}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    _main()
