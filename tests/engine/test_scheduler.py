"""Scheduler: continuous batching, chunked prefill, prefix reuse, KV policies (tiny models)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from inferenceos.engine.messages import Finished, TokenOut
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import Event, Request, Scheduler
from inferenceos.engine.session import LoadedModel
from inferenceos.errors import EngineBusyError, UsageError
from inferenceos.plan.llama_params import LlamaParams

N_SLOTS = 8
GREEDY = SamplingParams(temperature=0, max_tokens=24)


@pytest.fixture(scope="module")
def lm(tiny_llama: Path) -> Iterator[LoadedModel]:
    settings = LlamaParams(n_ctx=256 * N_SLOTS, n_batch=64, n_ubatch=64,
                           n_seq_max=N_SLOTS, n_threads=1)
    with LoadedModel(tiny_llama, settings) as model:
        yield model


def create_scheduler(lm: LoadedModel, **kw: object) -> Scheduler:
    return Scheduler(lm, N_SLOTS, int(kw.pop("budget", 64)), **kw)  # type: ignore[arg-type]


def drain(sched: Scheduler) -> tuple[dict[int, list[int]], dict[int, dict]]:
    tokens: dict[int, list[int]] = {}
    done: dict[int, dict] = {}
    while sched.has_work():
        for ev in sched.step():
            if isinstance(ev, TokenOut) and ev.token >= 0:
                tokens.setdefault(ev.req_id, []).append(ev.token)
            elif isinstance(ev, Finished):
                done[ev.req_id] = ev.metrics.to_json()
    return tokens, done


def prompts(lm: LoadedModel, n: int) -> list[list[int]]:
    texts = ["abc", "hello there", "xyz xyz", "a b c d", "quiet", "zebra", "kk ll", "the end"]
    return [lm.tokenize(texts[i % len(texts)] * (1 + i // len(texts))) for i in range(n)]


def test_eight_concurrent_greedy_outputs_match_alone(lm: LoadedModel) -> None:
    sched = create_scheduler(lm)
    ps = prompts(lm, 8)
    alone = []
    for i, p in enumerate(ps):
        sched.submit(Request(i, p, GREEDY))
        alone.append(drain(sched)[0][i])
    for i, p in enumerate(ps):
        sched.submit(Request(100 + i, p, GREEDY))
    together, done = drain(sched)
    assert [together[100 + i] for i in range(8)] == alone
    assert all(d["completion_tokens"] == 24 for d in done.values())


def test_long_prompt_does_not_stall_running_streams(lm: LoadedModel) -> None:
    sched = create_scheduler(lm, budget=16)
    sched.submit(Request(1, lm.tokenize("abc"), SamplingParams(temperature=0, max_tokens=60)))
    for _ in range(3):
        sched.step()  # request 1 is now generating
    long_prompt = lm.tokenize("ab " * 60)  # many 16-token prefill chunks
    sched.submit(Request(2, long_prompt, GREEDY))
    steps_with_token_for_1 = 0
    steps = 0
    while any(s.req.id == 2 and s.prefilling for s in sched.running) or sched.queue:
        events: list[Event] = sched.step()
        steps += 1
        steps_with_token_for_1 += any(ev.req_id == 1 and isinstance(ev, TokenOut)
                                      for ev in events)
    assert steps >= len(long_prompt) // 16
    assert steps_with_token_for_1 == steps  # decode went first on every step
    drain(sched)


def test_prefix_reuse_skips_cached_tokens_and_keeps_output(lm: LoadedModel) -> None:
    sched = create_scheduler(lm)
    base = lm.tokenize("a b c d e f g h i j k l m n o p")
    sched.submit(Request(1, base, GREEDY))
    drain(sched)
    longer = base + lm.tokenize(" q", add_special=False)
    sched.submit(Request(2, longer, GREEDY))
    reused_tokens, done = drain(sched)
    assert done[2]["cached_tokens"] >= len(base) - 1
    fresh = create_scheduler(lm, slot_policy="fifo")
    fresh.submit(Request(3, longer, GREEDY))
    fresh_tokens, fresh_done = drain(fresh)
    assert fresh_done[3]["cached_tokens"] == 0
    assert reused_tokens[2] == fresh_tokens[3]


def test_streaming_generates_far_past_the_context_in_flat_memory(lm: LoadedModel) -> None:
    sched = create_scheduler(lm, kv_policy="streaming")
    n = 10 * sched.n_ctx_slot
    sched.submit(Request(1, lm.tokenize("abc"),
                         SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)))
    peak = 0
    count = 0
    mem = lm._ll.llama_get_memory(lm.ctx)
    while sched.has_work():
        count += sum(isinstance(ev, TokenOut) for ev in sched.step())
        peak = max(peak, lm._ll.llama_memory_seq_pos_max(mem, 0) + 1)
    assert count == n
    assert peak <= sched.n_ctx_slot  # positions are shifted: the cache never grows


def test_without_policy_a_full_slot_ends_with_length(lm: LoadedModel) -> None:
    sched = create_scheduler(lm)
    endless = SamplingParams(temperature=0, max_tokens=10_000, ignore_eos=True)
    sched.submit(Request(1, lm.tokenize("abc"), endless))
    tokens, done = drain(sched)
    assert done[1]["stop_reason"] == "length"
    # every cell holds a prompt or generated token; the last token is sampled, not stored
    assert len(tokens[1]) + done[1]["prompt_tokens"] == sched.n_ctx_slot + 1


def test_cancel_frees_the_slot_at_once(lm: LoadedModel) -> None:
    sched = create_scheduler(lm)
    sched.submit(Request(1, lm.tokenize("abc"), SamplingParams(temperature=0, max_tokens=500)))
    sched.step()
    [ev] = sched.cancel(1)
    assert isinstance(ev, Finished) and (ev.req_id, ev.metrics.stop_reason) == (1, "interrupted")
    assert not sched.running and all(not s.busy for s in sched.slots)


def test_admission_limits(lm: LoadedModel) -> None:
    sched = create_scheduler(lm, max_queue=2)
    with pytest.raises(UsageError, match="a sequence holds 256"):
        sched.submit(Request(1, [5] * 297, GREEDY))
    with pytest.raises(UsageError, match="empty"):
        sched.submit(Request(2, [], GREEDY))
    sched.submit(Request(3, [1, 5], GREEDY))
    sched.submit(Request(4, [1, 5], GREEDY))
    with pytest.raises(EngineBusyError, match="busy"):
        sched.submit(Request(5, [1, 5], GREEDY))
    drain(sched)


def test_more_requests_than_slots_all_complete(lm: LoadedModel) -> None:
    sched = create_scheduler(lm)
    for i, p in enumerate(prompts(lm, 20)):
        sched.submit(Request(i, p, SamplingParams(temperature=0, max_tokens=5)))
    tokens, done = drain(sched)
    assert len(done) == 20 and all(len(tokens[i]) == 5 for i in range(20))


def test_quantized_v_cache_needs_flash_attention(tiny_llama: Path) -> None:
    with pytest.raises(UsageError, match="requires flash attention"):
        LoadedModel(tiny_llama, LlamaParams(n_ctx=256, type_v="q8_0", flash_attn=0))
    with pytest.raises(UsageError, match="unknown K cache type"):
        LoadedModel(tiny_llama, LlamaParams(n_ctx=256, type_k="q3"))


def test_prefill_chunks_shrink_to_the_step_time_target(lm: LoadedModel) -> None:
    sched = create_scheduler(lm, budget=64)
    assert sched.step_budget(generating=True) == 64  # nothing measured yet
    sched.s_per_token = 0.01  # 10 ms per batched token, as if measured
    sched.max_step_s = 0.2
    assert sched.step_budget(generating=True) == 20  # 0.2 s / 10 ms
    assert sched.step_budget(generating=False) == 64  # no stream waits: full chunks
    sched.s_per_token = 1.0
    assert sched.step_budget(generating=True) == 16  # never below one small chunk


def test_step_time_is_measured(lm: LoadedModel) -> None:
    sched = create_scheduler(lm)
    sched.submit(Request(1, lm.tokenize("abc"), GREEDY))
    drain(sched)
    assert sched.s_per_token > 0 and len(sched.step_times) > 0


def test_policy_per_request(lm: LoadedModel) -> None:
    sched = create_scheduler(lm)  # default: none
    endless = SamplingParams(temperature=0, max_tokens=3 * sched.n_ctx_slot, ignore_eos=True)
    sched.submit(Request(1, lm.tokenize("abc"), endless))  # engine default: ends at the slot
    sched.submit(Request(2, lm.tokenize("abc"), endless, kv_policy="streaming"))
    tokens, done = drain(sched)
    assert done[1]["stop_reason"] == "length" and len(tokens[1]) < sched.n_ctx_slot + 1
    assert len(tokens[2]) == 3 * sched.n_ctx_slot  # streaming went on
    with pytest.raises(UsageError, match="needs attention probabilities"):
        sched.submit(Request(3, lm.tokenize("abc"), GREEDY, kv_policy="h2o"))


def test_stats_report_kv_usage_per_slot(lm: LoadedModel) -> None:
    sched = create_scheduler(lm)
    sched.submit(Request(1, lm.tokenize("abc"), GREEDY))
    sched.step()
    sched.step()  # the prompt, then its last token in a step of its own
    st = sched.stats()
    assert st["running"] == 1 and st["waiting"] == 0
    busy = [s for s in st["slots"] if s["busy"]]
    assert len(busy) == 1 and busy[0]["cached_tokens"] == len(lm.tokenize("abc"))
    assert 0 < st["kv_usage"] < 1
    cap, used = busy[0]["capacity"], busy[0]["cached_tokens"]
    assert busy[0]["reserved_idle"] == pytest.approx(1 - used / cap)
    free = cap * len(st["slots"]) - used  # the largest free budget is one idle slot's
    assert st["kv_external_fragmentation"] == pytest.approx(1 - cap / free)
    assert busy[0]["cell_span"] is None and st["kv_window_cells"] is None  # no probe
    drain(sched)


def test_idle_prefixes_leave_the_pool_while_others_run_and_come_back(lm: LoadedModel) -> None:
    sched = create_scheduler(lm)
    base = lm.tokenize("a b c d e f g h i j k l m n o p")
    sched.submit(Request(1, lm.tokenize("zz"), SamplingParams(temperature=0, max_tokens=80,
                                                                ignore_eos=True)))
    sched.submit(Request(2, base, SamplingParams(temperature=0, max_tokens=4)))
    while any(s.req.id == 2 for s in sched.running) or sched.queue:
        sched.step()
    sched.step()  # request 1 still runs: request 2's finished prefix is parked
    [slot] = [s for s in sched.slots if s.cached == base + s.cached[len(base):] and not s.busy]
    assert sched.table.is_parked(slot)
    assert lm._ll.llama_memory_seq_pos_max(sched.mem, slot.index) == -1  # no cells in the pool
    longer = base + lm.tokenize(" q", add_special=False)
    sched.submit(Request(3, longer, GREEDY))
    tokens, done = drain(sched)
    assert done[3]["cached_tokens"] >= len(base) - 1  # restored, not prefilled again
    fresh = create_scheduler(lm)
    fresh.submit(Request(4, longer, GREEDY))
    assert drain(fresh)[0][4] == tokens[3]


def test_split_streams_put_rows_in_slot_order_after_the_completing_chunk() -> None:
    """One KV stream per slot: llama.cpp evaluates consecutive, increasing sequence ids
    as one micro-batch, so the rows after a prompt's completing chunk (row 0, kept for
    its first token's sake) follow slot order; a shared pool keeps the plan's order."""
    from inferenceos.engine.executor import Executor
    from inferenceos.engine.step_plan import DecodeWork, PrefillWork, StepPlan

    plan = StepPlan(decodes=(DecodeWork(3, 9, (1,)), DecodeWork(0, 5, (2, 7)),
                             DecodeWork(2, 4, (3,))),
                    prefills=(PrefillWork(5, 0, (4, 4), False), PrefillWork(1, 2, (6,), True)))
    split, shared = Executor(None, None, 16, 8, by_slot=True), Executor(None, None, 16, 8)
    try:
        rows = split.fill(plan)
        assert rows.prefill_last == {1: 0}
        order = sorted(rows.by_slot, key=lambda k: rows.by_slot[k][0])
        assert order == [1, 0, 2, 3, 5]
        assert rows.decode == {0: [1, 2], 2: [3], 3: [4]}
        seq_ids = [split.batch.raw.seq_id[i][0] for i in range(split.batch.n)]
        assert seq_ids == [1, 0, 0, 2, 3, 5, 5]
        rows = shared.fill(plan)
        assert sorted(rows.by_slot, key=lambda k: rows.by_slot[k][0]) == [1, 5, 3, 0, 2]
    finally:
        split.close()
        shared.close()


def test_split_streams_serve_a_staggered_load(tiny_llama: Path) -> None:
    """With one KV stream per slot, requests that start and end at different steps
    (slots busy in any order, prefill beside decode) all finish with their tokens, and
    a greedy reply equals the same request run alone there."""
    settings = LlamaParams(n_ctx=128 * 4, n_batch=64, n_ubatch=64, n_seq_max=4,
                           n_threads=1, kv_unified=False)
    with LoadedModel(tiny_llama, settings) as split:
        sched = Scheduler(split, 4, 64)
        assert sched.executor.by_slot
        ps = prompts(split, 6)
        sched.submit(Request(50, ps[5], GREEDY))
        alone = drain(sched)[0][50]
        for i, p in enumerate(ps[:5]):
            sched.submit(Request(i, p, SamplingParams(temperature=0, max_tokens=4 + 5 * i)))
        tokens: dict[int, list[int]] = {}
        steps = 0
        while sched.has_work():
            steps += 1
            if steps == 6:  # a prompt arrives while the others decode, in a freed slot
                sched.submit(Request(60, ps[5], GREEDY))
            for ev in sched.step():
                if isinstance(ev, TokenOut) and ev.token >= 0:
                    tokens.setdefault(ev.req_id, []).append(ev.token)
    assert [len(tokens[i]) for i in range(5)] == [4 + 5 * i for i in range(5)]
    assert tokens[60] == alone


def test_engines_share_one_pool_unless_the_settings_split_it() -> None:
    """per_slot: a shared pool by default (the plan's), one stream per slot when the
    settings ask for it with several sequences; one sequence is one pool either way."""
    from inferenceos.engine.base import per_slot

    assert per_slot(LlamaParams(n_ctx=256), 8).kv_unified
    split = per_slot(LlamaParams(n_ctx=256, kv_unified=False), 8)
    assert not split.kv_unified and split.n_ctx == 256 * 8 and split.n_seq_max == 8
    assert per_slot(LlamaParams(n_ctx=256, kv_unified=False), 1).kv_unified
