"""The tiered KV cache under the engine: a conversation's KV survives sleep (warm), a
killed worker and a new engine on the same data dir (a restart), and the next turn
reads the same tokens as the uninterrupted conversation. Real llama.cpp, real files."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from inferenceos.engine.engine import Engine
from inferenceos.engine.kv.entry import SUFFIX, is_temporary
from inferenceos.engine.sampling import SamplingParams
from inferenceos.plan.llama_params import LlamaParams

MiB = 1 << 20
SETTINGS = LlamaParams(n_ctx=512, n_batch=64, n_threads=1)
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
HISTORY = "hello abc " * 20  # ~200 tokens on the tiny byte vocabulary


def engine(path: Path, root: Path, ram: int = 64 * MiB, disk: int = 64 * MiB) -> Engine:
    return Engine(path, SETTINGS, n_parallel=2, kv_cache_ram=ram, kv_cache_disk=disk,
                  kv_cache_dir=root)


def turn(e: Engine, prompt: list[int]) -> tuple[list[int], int]:
    """Greedy tokens of one turn and the prompt tokens it reused."""
    g = e.generate(prompt, GREEDY)
    out = [ev.token for ev in g if ev.token >= 0]
    return out, g.metrics.cached_tokens


def kv_stats(e: Engine) -> dict[str, int]:
    stats: dict[str, int] = e.stats()["kv_cache"]
    return stats


def flushed(e: Engine) -> dict[str, int]:
    """The store's stats once its disk writes are done (what a kill would leave), asked
    of the worker until none is pending, for as long as the store itself would wait for
    them (KVStore.flush: 30 s). 5 s was too short for Qwen's turn beside a busy
    neighbour in the flake census: the writes were going on, not lost."""
    deadline = time.monotonic() + 30
    while (s := kv_stats(e))["pending_writes"]:
        assert time.monotonic() < deadline, f"disk writes never finished: {s}"
        time.sleep(0.01)
    return s


def kill_worker(e: Engine) -> None:
    """SIGKILL the engine's worker and wait until the engine has seen it die (its next
    request then starts a fresh worker instead of meeting the dead one)."""
    os.kill(e.worker_pid, 9)
    deadline = time.monotonic() + 10
    while e.worker_alive and time.monotonic() < deadline:
        time.sleep(0.01)


def entry_files(root: Path) -> list[Path]:
    return [p for p in root.rglob(f"*{SUFFIX}") if not is_temporary(p.name)]


@pytest.fixture()
def conversation(tiny_llama: Path, tmp_path: Path) -> tuple[list[int], list[int], list[int]]:
    """(turn 1 prompt, turn 2 prompt, turn 2's tokens in the uninterrupted conversation)."""
    with engine(tiny_llama, tmp_path / "ref", ram=0, disk=0) as e:  # no store: the slots
        first = e.tokenize(HISTORY)
        reply, _ = turn(e, first)
        second = first + reply + e.tokenize(" and then?", add_special=False)
        expected, cached = turn(e, second)
        assert cached == len(first) + len(reply) - 1  # hot: the slot held the history
    return first, second, expected


def test_warm_model_restores_its_conversation_instead_of_prefilling(
        tiny_llama: Path, tmp_path: Path, conversation: tuple[list[int], ...]) -> None:
    first, second, expected = conversation
    with engine(tiny_llama, tmp_path / "kv") as e:
        turn(e, first)
        e.sleep()  # hot -> warm: the context (and its cells) is freed
        e.wake()
        out, cached = turn(e, second)
        s = kv_stats(e)
    assert out == expected
    assert cached >= len(first) and s["hits_ram"] == 1 and s["restored_tokens_ram"] == cached


def test_a_killed_worker_and_a_restart_find_the_disk_tier(
        tiny_llama: Path, tmp_path: Path, conversation: tuple[list[int], ...]) -> None:
    first, second, expected = conversation
    root = tmp_path / "kv"
    with engine(tiny_llama, root) as e:
        turn(e, first)
        flushed(e)
        kill_worker(e)
        out, cached = turn(e, second)  # a fresh worker: RAM tier gone, disk tier there
        s = kv_stats(e)
    assert out == expected and cached >= len(first)
    assert s["hits_disk"] == 1
    with engine(tiny_llama, root) as e:  # a restarted server on the same data dir
        out, cached = turn(e, second)
        assert kv_stats(e)["hits_disk"] == 1
    assert out == expected and cached >= len(first)


def test_a_corrupt_entry_is_prefilled_never_restored(
        tiny_llama: Path, tmp_path: Path, conversation: tuple[list[int], ...]) -> None:
    first, second, expected = conversation
    root = tmp_path / "kv"
    with engine(tiny_llama, root) as e:
        turn(e, first)
        flushed(e)
    (path,) = entry_files(root)
    raw = bytearray(path.read_bytes())
    raw[len(raw) - 64] ^= 0xFF  # inside the KV bytes: only the checksum can tell
    path.write_bytes(bytes(raw))
    with engine(tiny_llama, root) as e:
        out, cached = turn(e, second)
        s = kv_stats(e)
    assert cached == 0 and s["dropped"] == 1 and s["hits_disk"] == 0
    assert len(out) == len(expected)  # answered (prefilled), nothing wrong restored


def test_a_budget_of_zero_keeps_nothing_and_still_serves(tiny_llama: Path, tmp_path: Path) -> None:
    root = tmp_path / "kv"
    with engine(tiny_llama, root, ram=0, disk=0) as e:
        first = e.tokenize(HISTORY)
        turn(e, first)
        e.sleep()
        e.wake()
        _, cached = turn(e, first)
        assert "kv_cache" not in e.stats()
    assert cached == 0 and not root.exists()


def test_a_disk_budget_smaller_than_an_entry_writes_nothing(tiny_llama: Path,
                                                             tmp_path: Path) -> None:
    root = tmp_path / "kv"
    with engine(tiny_llama, root, disk=4096) as e:
        turn(e, e.tokenize(HISTORY))
        s = flushed(e)
    assert s["ram_entries"] == 1 and s["disk_entries"] == 0 and not entry_files(root)


def test_a_resize_keeps_the_conversation(tiny_llama: Path, tmp_path: Path,
                                         conversation: tuple[list[int], ...]) -> None:
    first, second, expected = conversation
    with engine(tiny_llama, tmp_path / "kv") as e:
        turn(e, first)
        e.resize(1024)
        out, cached = turn(e, second)
    assert out == expected and cached >= len(first)


def test_a_resize_goes_through_the_store(tiny_llama: Path, tmp_path: Path,
                                         conversation: tuple[list[int], ...]) -> None:
    """A resize that keeps the KV layout carries no slot state in the context: the idle
    conversation is an entry of the store, and the next turn restores it from the RAM
    tier (a store hit), where a carried slot would have been a hot hit."""
    first, second, expected = conversation
    with engine(tiny_llama, tmp_path / "kv") as e:
        turn(e, first)
        info = e.resize(1024)
        out, cached = turn(e, second)
        s = kv_stats(e)
    assert info["carried"] == 1  # one conversation kept (in the store)
    assert out == expected and cached >= len(first)
    assert s["hits_ram"] == 1 and s["hits_hot"] == 0


def test_a_migration_moves_idle_conversations_through_the_store(
        tiny_llama: Path, tmp_path: Path, conversation: tuple[list[int], ...]) -> None:
    """A live migration to a new worker with the same KV layout sends no idle prefix
    down the pipe: the old worker stores it (and writes it before it exits), the new
    one restores it from the disk tier."""
    first, second, expected = conversation
    with engine(tiny_llama, tmp_path / "kv") as e:
        turn(e, first)
        info = e.migrate(SETTINGS)
        out, cached = turn(e, second)
        s = kv_stats(e)
    assert info["prefixes"] == 0 and info["kv_bytes"] == 0  # nothing through the pipe
    assert out == expected and cached >= len(first) and s["hits_disk"] == 1


def test_a_ram_only_store_still_carries_idle_prefixes_across_a_migration(
        tiny_llama: Path, tmp_path: Path, conversation: tuple[list[int], ...]) -> None:
    """Without a disk tier the old worker's entries die with it: the idle prefix goes
    down the pipe as before, and the next turn still reuses it."""
    first, second, expected = conversation
    with engine(tiny_llama, tmp_path / "kv", disk=0) as e:
        turn(e, first)
        info = e.migrate(SETTINGS)
        out, cached = turn(e, second)
    assert info["prefixes"] == 1 and info["kv_bytes"] > 0
    assert out == expected and cached >= len(first)


def test_a_resize_leaves_the_conversation_in_the_disk_tier(
        tiny_llama: Path, tmp_path: Path, conversation: tuple[list[int], ...]) -> None:
    """The resize keeps the conversation as a store entry, written to disk: a worker
    that dies after the resize still finds it there."""
    first, second, expected = conversation
    with engine(tiny_llama, tmp_path / "kv") as e:
        turn(e, first)
        e.resize(1024)
        flushed(e)
        kill_worker(e)
        out, cached = turn(e, second)
        s = kv_stats(e)
    assert out == expected and cached >= len(first) and s["hits_disk"] == 1


@pytest.mark.slow
def test_qwen_restored_turn_matches_the_uninterrupted_one(qwen05_path: Path,
                                                          tmp_path: Path) -> None:
    """Qwen2.5-Coder-0.5B-Instruct, greedy, one thread: the next turn after a restart
    reads exactly the tokens it reads when the model stayed hot."""
    settings = LlamaParams(n_ctx=2048, n_threads=1)
    greedy = SamplingParams(temperature=0, max_tokens=16)
    history = "Summarise: " + " ".join(f"line {i} says {i * 7 % 13}." for i in range(40))

    def run(e: Engine, prompt: list[int]) -> tuple[list[int], int]:
        g = e.generate(prompt, greedy)
        return [ev.token for ev in g if ev.token >= 0], g.metrics.cached_tokens

    with Engine(qwen05_path, settings, n_parallel=1) as e:  # no store: the hot path
        first = e.tokenize(history)
        reply, _ = run(e, first)
        second = first + reply + e.tokenize(" Now in one word:", add_special=False)
        hot, hot_cached = run(e, second)
    root = tmp_path / "kv"
    kw: dict[str, Any] = {"kv_cache_ram": 256 * MiB, "kv_cache_disk": 256 * MiB,
                          "kv_cache_dir": root}
    with Engine(qwen05_path, settings, n_parallel=1, **kw) as e:
        assert run(e, first)[0] == reply
        flushed(e)
    with Engine(qwen05_path, settings, n_parallel=1, **kw) as e:  # a restart
        restored, cached = run(e, second)
    assert cached == hot_cached and restored == hot


def test_windowed_swa_layers_restore_whole_entries_only(tiny_swa: Path, tmp_path: Path) -> None:
    """With sliding-window layers that keep only their window (swa_full off), a state
    cannot be cut shorter: a prompt that extends an entry restores it whole, one that
    leaves it midway is prefilled; both answer as the uninterrupted conversation."""
    settings = LlamaParams(n_ctx=512, n_batch=64, n_threads=1, swa_full=False)

    def make(root: Path | None) -> Engine:
        kw: dict[str, Any] = ({"kv_cache_ram": 64 * MiB, "kv_cache_disk": 0,
                               "kv_cache_dir": None} if root else {})
        return Engine(tiny_swa, settings, n_parallel=1, **kw)

    with make(None) as ref:
        first = ref.tokenize(HISTORY)
        reply, _ = turn(ref, first)
        extends = first + reply + ref.tokenize(" more", add_special=False)
        expected, _ = turn(ref, extends)
    with make(tmp_path) as e:
        turn(e, first)
        assert kv_stats(e)["partial"] == 0
        e.sleep()
        e.wake()
        out, cached = turn(e, extends)
        assert out == expected and cached == len(first) + len(reply) - 1
        _, cached = turn(e, [*first[:100], first[100] ^ 1, *first[101:]])  # leaves midway
        assert kv_stats(e)["hits_ram"] == 1
