"""simulate's outlook of serve's tiered KV cache: the tiers' share of memory, how many
prompt-sized prefixes each holds, and a restore against a prefill again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferenceos.cli.main import app
from plan_factories import make_facts, write_sparse_gguf

runner = CliRunner()
MiB = 1 << 20
# make_facts is 8B-shaped: 32 layers, 8 KV heads of 128 values, K and V
F16_BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sparse_gguf(tmp_path_factory.mktemp("sparse") / "m.gguf", make_facts())


def _kv(model: Path, *args: str) -> dict:  # type: ignore[type-arg]
    res = runner.invoke(app, ["simulate", str(model), "--json", "--ram", "64GiB",
                              "--kv-cache-ram", "256MiB", "--kv-cache-disk", "2GiB", *args])
    assert res.exit_code == 0, res.output
    out: dict = json.loads(res.stdout)["kv_cache"]  # type: ignore[type-arg]
    return out


def test_a_prefix_is_its_tokens_kv_bytes_and_the_tiers_hold_what_fits(model: Path) -> None:
    kv = _kv(model, "--prompt-tokens", "1000")
    assert kv["prefix_tokens"] == 1000
    assert kv["prefix_bytes"] == 1000 * F16_BYTES_PER_TOKEN  # 125 MiB
    assert kv["ram_budget_bytes"] == 256 * MiB and kv["disk_budget_bytes"] == 2048 * MiB
    assert kv["ram_entries"] == 256 * MiB // kv["prefix_bytes"] == 2
    assert kv["disk_entries"] == 2048 * MiB // kv["prefix_bytes"] == 16
    # a restore reads the state and evaluates one token; a prefill evaluates them all
    assert 0 < kv["restore_ram_s"] <= kv["restore_disk_s"] < kv["prefill_s"]


def test_a_quantized_cache_and_a_longer_prompt_change_the_prefix(model: Path) -> None:
    base = _kv(model, "--prompt-tokens", "1000")
    longer = _kv(model, "--prompt-tokens", "2000")
    q8 = _kv(model, "--prompt-tokens", "1000", "--cache-type", "q8_0")
    assert longer["prefix_bytes"] == 2 * base["prefix_bytes"]
    assert longer["prefill_s"] > base["prefill_s"]
    assert q8["prefix_bytes"] < base["prefix_bytes"]  # 34 bytes per 32 values, not 64


def test_the_report_shows_the_tiers_share(model: Path) -> None:
    res = runner.invoke(app, ["simulate", str(model), "--ram", "64GiB",
                              "--kv-cache-ram", "256MiB", "--kv-cache-disk", "2GiB",
                              "--prompt-tokens", "1000"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "KV cache (serve)" in res.stdout
    assert "256.0 MiB" in res.stdout and "2 1000-token prefixes" in res.stdout
    assert "prefilled again" in res.stdout
