"""Live migration, the mechanism: an Engine moves to a new worker on new settings while
streams run, and every stream continues token-identically (greedy), with no error,
repeated or lost token."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

from inferenceos.engine.engine import Engine
from inferenceos.engine.sampling import SamplingParams
from inferenceos.plan.llama_params import LlamaParams

LONG = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)
SETTINGS = LlamaParams(n_ctx=4096, n_batch=64, n_ubatch=64, n_threads=1)


def _undisturbed(path: Path, prompt: str,
                 max_tokens: int = LONG.max_tokens) -> tuple[list[int], str]:
    with Engine(path, SETTINGS, n_parallel=2) as engine:
        gen = engine.generate(prompt, replace(LONG, max_tokens=max_tokens))
        events = list(gen)
    return [e.token for e in events], "".join(e.text for e in events)


def test_a_stream_migrates_down_and_back_up_token_identically(tiny_wide: Path) -> None:
    want_tokens, want_text = _undisturbed(tiny_wide, "ab cab")
    with Engine(tiny_wide, SETTINGS, n_parallel=2) as engine:
        gen = engine.generate("ab cab", LONG)
        it = iter(gen)
        events = [next(it) for _ in range(5)]
        down = engine.migrate(LlamaParams(n_ctx=3072, n_batch=32, n_ubatch=32, n_threads=1))
        events += [next(it) for _ in range(5)]
        up = engine.migrate(SETTINGS, make_before_break=False)
        events += list(it)
    assert down["moved"] == 1 and up["moved"] == 1, (down, up)
    assert down["restored"] == 1 and up["restored"] == 1
    assert down["prefixes"] == 0 and up["prefixes"] == 0  # the running slot is not one
    assert gen.metrics.stop_reason == "length"
    assert engine.n_ctx == 4096
    # exactly: the moved stream takes the cells it held (a lone stream: 0..n-1), so even
    # the kernels' float rounding is the undisturbed run's (no near tie may flip)
    assert [e.token for e in events] == want_tokens
    assert "".join(e.text for e in events) == want_text


def test_a_moved_stream_takes_the_cells_of_a_fresh_engine(tiny_wide: Path) -> None:
    """The root cause of a flaky mismatch, deterministically, in process: a new worker
    held its warm-up prompt in a slot, and the old one exported the running sequence's
    own slot again as an idle prefix; the moved sequence's cells then lay after those,
    attention summed over a shifted layout, and a near tie flipped ~440 tokens later.
    The importing side now starts from an empty cache, and only idle slots are prefixes."""
    from inferenceos.engine.messages import TokenOut
    from inferenceos.engine.scheduler import Request, Scheduler
    from inferenceos.engine.session import LoadedModel
    from inferenceos.engine.worker.migrate import export_live, import_live

    settings = replace(SETTINGS, n_seq_max=2, kv_unified=True)

    def drain(sched: Scheduler, out: list[int]) -> None:
        while sched.has_work():
            out += [ev.token for ev in sched.step() if isinstance(ev, TokenOut) and ev.token >= 0]

    with LoadedModel(tiny_wide, settings) as lm:
        prompt = lm.tokenize("ab cab")
        old = Scheduler(lm, 2, 64)
        old.submit(Request(1, prompt, LONG))
        want: list[int] = []
        drain(old, want)
        old.close()
        old = Scheduler(lm, 2, 64)  # the same run, moved after 5 tokens
        old.submit(Request(1, prompt, LONG))
        got: list[int] = []
        while len(got) < 5:
            got += [ev.token for ev in old.step() if isinstance(ev, TokenOut)]
        state = export_live(old)
        old.close()
        assert state.prefixes == []  # no idle slot: the running one's is not a prefix
        new = Scheduler(lm, 2, 64)  # a warmed worker: a short request went first
        new.submit(Request(2, lm.tokenize("Hello"), SamplingParams(temperature=0, max_tokens=2)))
        drain(new, [])
        assert import_live(new, state)["restored"] == 1
        drain(new, got)
        new.close()
    assert got == want


def test_make_before_break_shares_the_cores(tiny_wide: Path) -> None:
    """On as many threads as there are cores (the default), the old worker computes on
    one core fewer while the new one loads, the new one warms up on what is left and
    gets its own threads once the old one is gone: the stream goes on, none lost.
    Tokens are not compared: on two threads llama.cpp's CPU decode is not bitwise the
    same run to run (this model's near tie at token 255 flipped in 1 of 9 fresh,
    undisturbed runs here); exactness is tested on one thread above."""
    from inferenceos.engine.messages import SetThreads
    from inferenceos.engine.session import default_threads

    settings = replace(SETTINGS, n_threads=0)  # every core
    with Engine(tiny_wide, settings, n_parallel=2) as engine:
        gen = engine.generate("ab cab", LONG)
        it = iter(gen)
        tokens = [next(it).token for _ in range(5)]
        info = engine.migrate(replace(settings, n_ctx=3072))
        tokens += [e.token for e in it if e.token >= 0]
        assert engine._ask(SetThreads(None)) == default_threads()
    assert info["moved"] == 1 and info["restored"] == 1, info
    assert len(tokens) == LONG.max_tokens
    assert gen.metrics.stop_reason == "length"


def test_core_shares() -> None:
    """Threads (old worker, new worker) while both run; None when the cores hold both."""
    from inferenceos.engine.worker.swap import _core_shares

    two = replace(SETTINGS, n_threads=2)
    assert _core_shares(two, two, cores=2) == (1, 1)
    assert _core_shares(two, two, cores=4) is None
    assert _core_shares(SETTINGS, SETTINGS, cores=2) is None  # 1 + 1 thread on 2 cores
    every = replace(SETTINGS, n_threads=0)
    assert _core_shares(every, every, cores=16) == (15, 1)
    assert _core_shares(every, two, cores=1) == (1, 1)  # one core: nothing to share


def test_another_kv_type_reprefills_and_continues(tiny_wide: Path) -> None:
    """Another KV type refuses the state bytes: the sequence re-prefills its tokens and
    goes on without an error or a lost / repeated token (the same count)."""
    # only the first tokens are compared: the undisturbed run needs no more of them
    want_tokens, _ = _undisturbed(tiny_wide, "hello", max_tokens=8)
    # the tiny model's heads (16 values) are too small for q8_0 blocks: f32 is another
    # KV type all the same, whose state bytes llama.cpp refuses for an f16 cache
    q8 = LlamaParams(n_ctx=4096, n_batch=64, n_ubatch=64, n_threads=1, type_k="f32",
                     type_v="f32")
    with Engine(tiny_wide, SETTINGS, n_parallel=2) as engine:
        gen = engine.generate("hello", LONG)
        it = iter(gen)
        events = [next(it) for _ in range(8)]
        info = engine.migrate(q8)
        events += list(it)
    assert info["moved"] == 1 and info["reprefilled"] == 1, info
    # the other KV type's rounding may take the stream another way, which can end inside
    # a UTF-8 character: then a last event (token -1) flushes the held bytes
    tokens = [e.token for e in events if e.token >= 0]
    assert len(tokens) == LONG.max_tokens  # none lost or repeated (EOS is ignored)
    assert tokens[:8] == want_tokens
    assert gen.metrics.stop_reason == "length"


def test_parallel_and_queued_streams_all_survive(tiny_llama: Path) -> None:
    """Every stream finishes whole (no error, none lost, the right count). Their tokens
    are not compared with lone runs: batched rows may break near-ties differently
    (docs/engine.md), and a move can change a sequence's row and cells."""
    prompts = ["ab", "cab", "abc abc"]  # three streams on two slots: one waits
    got: dict[str, list[int]] = {}
    with Engine(tiny_llama, SETTINGS, n_parallel=2) as engine:
        gens = {p: engine.generate(p, LONG) for p in prompts}
        started = threading.Barrier(len(prompts) + 1)

        def read(p: str) -> None:
            it = iter(gens[p])
            first = next(it) if p != "abc abc" else None
            started.wait()
            got[p] = ([first.token] if first else []) + [e.token for e in it if e.token >= 0]

        threads = [threading.Thread(target=read, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        started.wait()
        # break before make: the export comes at once, with both slots busy and one queued
        info = engine.migrate(LlamaParams(n_ctx=3500, n_batch=64, n_ubatch=64, n_threads=1),
                              make_before_break=False)
        for t in threads:
            t.join(60)
    assert info["moved"] == 3 and info["restored"] == 2, info
    assert {p: len(t) for p, t in got.items()} == dict.fromkeys(prompts, LONG.max_tokens)
