"""`chat` with no model named: Qwen2.5-Coder-0.5B-Instruct when the `chat` extra is
installed (the built-in Gemma is a base model that cannot chat), else the built-in model
with a one-line hint; packaged models resolve by name like the built-in one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from inferenceos.api import resolve
from inferenceos.model import default_model
from inferenceos.model.default_model import CHAT_MODEL_NAME, default_chat_model
from inferenceos.model.packaged_models import QWEN_05B, marker_path, packaged_model_available


def _cache_with_qwen(qwen05_path: Path, cache: Path) -> Path:
    """A cache dir whose models/ holds the already assembled Qwen 0.5B (a symlink and
    its marker: no 491 MB copy per test)."""
    models = cache / "models"
    models.mkdir(parents=True)
    (models / qwen05_path.name).symlink_to(qwen05_path)
    shutil.copy(marker_path(qwen05_path), marker_path(models / qwen05_path.name))
    return cache


def test_without_the_chat_extra_the_built_in_model_stays_the_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    missing = replace(QWEN_05B, prefix="no-such-inferenceos-part")
    assert not packaged_model_available(missing)
    monkeypatch.setattr(default_model, "QWEN_05B", missing)
    assert default_chat_model() == ""


@pytest.mark.slow
def test_packaged_model_resolves_by_name(qwen05_path: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERENCEOS_CACHE_DIR", str(_cache_with_qwen(qwen05_path, tmp_path)))
    assert default_chat_model() == CHAT_MODEL_NAME
    path = resolve(CHAT_MODEL_NAME)
    assert path.name == QWEN_05B.filename and path.resolve() == qwen05_path.resolve()


@pytest.mark.slow
def test_chat_with_no_model_answers_on_the_instruction_tuned_model(
        qwen05_path: Path, tmp_path: Path) -> None:
    env = dict(os.environ, INFERENCEOS_CACHE_DIR=str(_cache_with_qwen(qwen05_path, tmp_path)))
    out = subprocess.run(
        [sys.executable, "-m", "inferenceos", "chat", "--local", "--theme", "none", "-t", "0"],
        input="What is the capital of France? Answer with one word.\n/bye\n",
        capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"chatting with {CHAT_MODEL_NAME}" in out.stdout
    assert "Paris" in out.stdout and "base model" not in out.stderr
