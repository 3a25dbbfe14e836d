"""The tiered KV cache through a real `inferenceos serve`: a conversation sent again
after the server restarted is restored from the disk tier, and every dialect reports
the restored prefix (OpenAI `usage.prompt_tokens_details.cached_tokens`, llama-server
`timings.cache_n`, Ollama `prompt_eval_cached_count`), and /metrics counts the hit.
Two servers on one data dir share its disk tier without corrupting it or exceeding its
budget."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from cli_helpers import run_cli, start_serve

HISTORY = "Remember: " + "hello abc " * 30
ARGS = ("--ctx", "512", "--threads", "1", "--parallel", "1", "--kv-cache-ram", "64MiB",
        "--kv-cache-disk", "64MiB")


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    return err


def _chat(base: str, text: str) -> dict[str, object]:
    r = httpx.post(base + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": text}], "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    out: dict[str, object] = r.json()
    return out


def _written(base: str) -> None:
    """Wait until the finished turn's entry is on disk (the scrape shows it)."""
    for _ in range(300):
        text = httpx.get(base + "/metrics", timeout=30).text
        if 'kv_cache_entries{model_name="tiny-llama:latest",tier="disk"} 1.0' in text:
            return
        time.sleep(0.1)
    raise AssertionError("the entry never reached the disk tier")


@pytest.mark.slow
def test_a_restarted_server_restores_the_conversation_in_every_dialect(
        tiny_llama: Path) -> None:
    proc, base = start_serve(str(tiny_llama), *ARGS)
    try:
        first = _chat(base, HISTORY)
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # type: ignore[index]
        _written(base)
    finally:
        _stop(proc)
    proc, base = start_serve(str(tiny_llama), *ARGS)  # a restart: nothing in RAM
    try:
        again = _chat(base, HISTORY)  # the same conversation, returning
        n_prompt = again["usage"]["prompt_tokens"]  # type: ignore[index]
        cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]  # type: ignore[index]
        assert cached == n_prompt - 1  # all but the last token (evaluated alone)
        metrics = httpx.get(base + "/metrics", timeout=30).text
        assert 'kv_cache_hits_total{model_name="tiny-llama:latest",tier="disk"} 1.0' in metrics
        assert 'kv_cache_restored_tokens_total{model_name="tiny-llama:latest",tier="disk"} ' \
               f"{float(cached)}" in metrics
        r = httpx.post(base + "/completion", timeout=120, json={
            "prompt": "Remember: " + "hello abc " * 30 + "and more", "n_predict": 2})
        assert r.status_code == 200 and r.json()["timings"]["cache_n"] > 0
        # Ollama's dialect: the whole prompt in prompt_eval_count, the cached part in
        # prompt_eval_cached_count (read raw: the ollama client's models drop the field)
        r = httpx.post(base + "/api/chat", timeout=120, json={
            "model": "tiny-llama", "messages": [{"role": "user", "content": HISTORY}],
            "stream": False, "options": {"num_predict": 4, "temperature": 0}})
        assert r.status_code == 200, r.text
        assert r.json()["prompt_eval_count"] == n_prompt
        assert r.json()["prompt_eval_cached_count"] == n_prompt - 1
    finally:
        _stop(proc)
    # `telemetry` shows the cache: the recorded generations' reuse and the disk tier
    status = run_cli("telemetry", "--json")
    assert status.returncode == 0, status.stderr
    kv = json.loads(status.stdout)["kv_cache"]
    assert kv["hits"] >= 3 and kv["generations"] >= 4, kv  # the restored /v1, /api, /completion
    assert kv["cached_tokens"] >= 2 * cached and kv["disk_entries"] >= 1, kv
    assert "reused a cached prefix" in run_cli("telemetry").stdout


# 12 conversations: each turn's entry is ~the same size, and the budget holds a few of
# them, so the two servers' writers evict each other's files as they go
CONVERSATIONS = [f"Conversation {i}: " + "hello abc " * 24 + f"about topic {i}"
                 for i in range(12)]


def _kv_files(home: Path) -> list[Path]:
    return sorted((home / "data" / "kv-cache").rglob("*.kv"))


@pytest.mark.slow
def test_two_servers_on_one_data_dir_share_the_disk_tier_whole_and_within_budget(
        tiny_llama: Path, isolated_home: Path) -> None:
    # one entry of these conversations is ~88 KiB on the tiny model (measured): the
    # budget keeps four of the 16 turns written
    budget = 360 << 10
    args = (*ARGS[:-1], str(budget))
    servers = [start_serve(str(tiny_llama), *args) for _ in range(2)]
    jobs = [(servers[0][1], c) for c in CONVERSATIONS[:8]] + \
           [(servers[1][1], c) for c in CONVERSATIONS[4:]]  # 4 written by both
    try:
        with ThreadPoolExecutor(4) as pool:  # both servers write at once
            first = list(pool.map(lambda job: _chat(*job), jobs))
        for _, base in servers:
            httpx.get(base + "/health", timeout=30).raise_for_status()
    finally:
        errs = [_stop(proc) for proc, _ in servers]  # a stop flushes the writers
    assert all("Traceback" not in e for e in errs)
    files = _kv_files(isolated_home)
    assert 2 <= len(files) < len(CONVERSATIONS)  # written, and evicted to fit
    assert sum(f.stat().st_size for f in files) <= budget
    listed = json.loads(run_cli("cache", "list", "--json").stdout)["kv-cache"]
    assert sum(k["entries"] for k in listed["keys"].values()) == len(files)  # none torn
    replies = {text: r["choices"][0]["message"]["content"]  # type: ignore[index]
               for (_, text), r in zip(jobs, first, strict=True)}
    proc, base = start_serve(str(tiny_llama), *args)  # a third server finds what is left
    try:
        hits = 0
        for text in CONVERSATIONS:
            again = _chat(base, text)
            usage = again["usage"]  # type: ignore[index]
            cached = usage["prompt_tokens_details"]["cached_tokens"]  # type: ignore[index]
            # the longest cached prefix: a whole earlier turn, or only the part a
            # surviving entry shares with it (the template and "Conversation ")
            assert 0 <= cached <= usage["prompt_tokens"] - 1  # type: ignore[index]
            hits += cached == usage["prompt_tokens"] - 1  # type: ignore[index]
            # restored or prefilled, the reply is the one the conversation first got
            assert again["choices"][0]["message"]["content"] == replies[text]  # type: ignore[index]
        assert hits >= 1  # its own turns evict the rest as it goes (value-ranked)
    finally:
        _stop(proc)
