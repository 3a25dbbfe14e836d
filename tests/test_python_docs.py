"""docs/python.md stays true: each ```python block runs as its own script.

The scripts run in a fresh interpreter (as a user's would: no `__main__` guard, cheap
import) from a folder that holds a tiny test model at the path the docs use.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import cli_env

DOC = Path(__file__).resolve().parent.parent / "docs" / "python.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
DOC_MODEL = "models/llama-3-8b-instruct.Q4_K_M.gguf"


def test_the_doc_has_examples() -> None:
    assert len(BLOCKS) >= 7
    assert all(DOC_MODEL in b or "no-such-model" in b for b in BLOCKS)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_block_runs(index: int, tiny_llama: Path, tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    shutil.copy(tiny_llama, tmp_path / DOC_MODEL)
    script = tmp_path / f"block{index}.py"
    script.write_text(BLOCKS[index], encoding="utf-8")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=180, env=cli_env())
    assert r.returncode == 0, f"block {index} failed:\n{BLOCKS[index]}\n{r.stderr[-3000:]}"
    assert r.stdout.strip(), "every example prints something"
