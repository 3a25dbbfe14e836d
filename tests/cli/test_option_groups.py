"""The typed option groups the CLI's commands build from their flags (cli/gen_opts,
cli/serve_opts, app/serve): each gives the engine, planner or server the values a
command used to assemble by hand, and each command's flags come from one alias."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from inferenceos.app.serve import PoolOptions
from inferenceos.cli.gen_opts import LoadOptions, SamplingOptions
from inferenceos.cli.run_cmd import run
from inferenceos.cli.serve_opts import ListenOptions
from inferenceos.config import load_config
from inferenceos.engine.sampling import SamplingParams
from inferenceos.errors import UsageError


def test_sampling_options_are_the_params_run_sampled_with() -> None:
    opts = SamplingOptions(0.0, 5, 0.5, 0.1, 7, 32, ("END",), True)
    assert opts.params() == SamplingParams(temperature=0.0, top_k=5, top_p=0.5, min_p=0.1,
                                           seed=7, max_tokens=32, stop=("END",),
                                           ignore_eos=True)
    assert set(opts.chat_options()) == {
        "temperature", "top_k", "top_p", "min_p", "seed", "max_tokens"}


def test_runs_flag_defaults_are_the_engines_but_max_tokens() -> None:
    """The group has no defaults of its own: run's signature holds them, and they are
    the engine's, but for max_tokens (run's --max-tokens 256)."""
    flags = inspect.signature(run).parameters
    opts = SamplingOptions(*(flags[name].default for name in (
        "temperature", "top_k", "top_p", "min_p", "seed", "max_tokens")))
    assert opts.params() == SamplingParams(max_tokens=256)


def test_sampling_options_out_of_range_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="top-p"):
        SamplingOptions(0.8, 40, 2.0, 0.05, None, 256).params()


def test_load_options_make_the_request_with_the_configs_defaults() -> None:
    req = LoadOptions(ctx=2048, threads=3, gpu_layers=0, backend="cpu", cache_type_k="q8_0",
                      policy="latency", ram="1GiB", draft="none").request(n_batch=64)
    assert (req.n_ctx, req.threads, req.gpu_layers, req.backend) == (2048, 3, 0, "cpu")
    assert (req.type_k, req.policy, req.n_batch, req.draft) == ("q8_0", "latency", 64, "none")
    assert req.ram == 1 << 30
    assert LoadOptions().request().draft == "auto"  # plan.draft's default


def test_flash_attention_on_with_a_policy_that_reads_attention_is_refused() -> None:
    assert LoadOptions(flash_attn="on").request(reads_attention=False).flash_attn is True
    assert LoadOptions(flash_attn="auto").request(reads_attention=True).flash_attn is False
    with pytest.raises(UsageError, match="flash-attn"):
        LoadOptions(flash_attn="on").request(reads_attention=True)


def test_listen_options_over_the_config() -> None:
    cfg = load_config()
    pool = PoolOptions(parallel=2, queue=9)
    s = ListenOptions(port=8123, allow_host=("box",), max_body_mb=1.0,
                      tls_cert=Path("c.pem")).settings(cfg, pool)
    assert (s.host, s.port) == (cfg.get("server.host"), 8123)
    assert (s.max_running, s.max_waiting, s.max_body_bytes) == (2, 9, 1 << 20)
    assert s.allowed_hosts == ("box",)


def test_pool_memory_cap() -> None:
    assert PoolOptions().memory_cap() is None
    assert PoolOptions(memory_budget="2GiB").memory_cap() == 2 << 30
