"""LlamaLog: marks stay valid after the bounded buffer drops old lines."""

from __future__ import annotations

from inferenceos.engine.llama.lib import LlamaLog


def test_since_mark_after_wraparound() -> None:
    log = LlamaLog(max_lines=5)
    for i in range(8):
        log.write(2, f"line {i}\n")
    mark = log.mark()
    log.write(4, "boom\n")
    log.write(2, "after\n")
    assert log.since(mark) == ["boom", "after"]
    assert log.errors_since(mark) == ["boom"]


def test_pieces_are_joined_into_lines() -> None:
    log = LlamaLog()
    mark = log.mark()
    log.write(2, "KV buffer ")
    log.write(5, "size = 24.00 MiB\n")
    assert log.since(mark) == ["KV buffer size = 24.00 MiB"]
