"""KV policies are discovered through entry points, built-ins and plugins alike."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_helpers import run_cli
from inferenceos.engine.kv.policies import StreamingLLM, available_policies, load_policy
from inferenceos.errors import UsageError

PLUGIN_SOURCE = '''
class KeepFirst:
    """Drops everything but the first 8 tokens when full."""
    name = "keepfirst"
    def make_room(self, seq):
        seq.remove(8, seq.n_past)
        return True
'''


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An installed (importable, with dist-info) plugin package registering 'keepfirst'."""
    (tmp_path / "ios_plugin_demo.py").write_text(PLUGIN_SOURCE)
    info = tmp_path / "ios_plugin_demo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ios-plugin-demo\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[inferenceos.kv_policies]\nkeepfirst = ios_plugin_demo:KeepFirst\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("ios_plugin_demo", None)


def test_builtins_are_registered_entry_points() -> None:
    found = available_policies()
    assert found["streaming"] == "inferenceos.engine.kv.policies:StreamingLLM"
    assert isinstance(load_policy("streaming"), StreamingLLM)


def test_plugin_policy_is_discovered_and_loaded(plugin_dir: Path) -> None:
    assert "keepfirst" in available_policies()
    assert load_policy("keepfirst").name == "keepfirst"


def test_plugin_policy_runs_in_the_scheduler(plugin_dir: Path, tiny_llama: Path) -> None:
    from inferenceos.engine.messages import TokenOut
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.engine.scheduler import Request, Scheduler
    from inferenceos.engine.session import LoadedModel
    from inferenceos.plan.llama_params import LlamaParams

    with LoadedModel(tiny_llama, LlamaParams(n_ctx=128, n_batch=32, n_threads=1)) as lm:
        sched = Scheduler(lm, 1, 32, kv_policy="keepfirst")
        endless = SamplingParams(temperature=0, max_tokens=500, ignore_eos=True)
        sched.submit(Request(1, lm.tokenize("abc"), endless))
        count = 0
        while sched.has_work():
            count += sum(isinstance(ev, TokenOut) for ev in sched.step())
    assert count == 500  # far past the 128-token slot: the plugin made room


def test_unknown_policy_lists_the_available_ones() -> None:
    with pytest.raises(UsageError, match=r"available: .*streaming"):
        load_policy("nope")


def test_plugins_command_lists_plugins(plugin_dir: Path) -> None:
    r = run_cli("plugins", "--json", PYTHONPATH=f"{plugin_dir}")
    assert r.returncode == 0, r.stderr
    policies = json.loads(r.stdout)["kv_policies"]
    assert {"none", "streaming", "keepfirst"} <= set(policies)
