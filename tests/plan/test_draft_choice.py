"""The drafter as a plan decision (plan/draft_choice.py): priced by the cost model and
what this model's runs measured, chosen only from evidence, within the RAM left."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferenceos.plan import draft_choice as dc
from inferenceos.plan.speculative import DraftEvidence, pool_evidence
from plan_factories import make_facts

TARGET = make_facts(n_layer=8, n_embd=1024, n_ff=2816, n_vocab=32000, name="target")
DRAFT = make_facts(n_layer=4, n_embd=512, n_ff=1024, n_vocab=32000, name="draft")


def _evidence(table: dict[str, DraftEvidence]) -> dc.Evidence:
    return lambda model, name: table.get(dc.spec.drafter_kind(name))


# a copying workload: 3 tokens per verification step for 2.5 drafts each
COPYING = DraftEvidence(runs=3, draft_tokens=250, draft_accepted=200, decode_steps=100,
                        output_tokens=300, replayed=3)
# free text: drafts at a few bigram matches, a third accepted
FREE = DraftEvidence(runs=3, draft_tokens=30, draft_accepted=10, decode_steps=290,
                     output_tokens=300, replayed=3)


def _price(evidence: dict[str, DraftEvidence], ram_left: int = 1 << 40,
           candidates: tuple[str, ...] = ("ngram", "self"), c_row: float = 0.2,
           ) -> list[dc.DraftOption]:
    return dc.price_drafters(TARGET, candidates, c_row, 4096, ram_left,
                             lambda path: DRAFT, _evidence(evidence))


def test_without_any_run_of_the_model_auto_decodes_plainly() -> None:
    """Priors are shown, never acted on: even a prior that would pay (a GPU's nearly free
    verification row) does not choose a drafter without this model's runs."""
    options = _price({}, c_row=dc.MIN_ROW_COST)
    assert any(o.drafter == "ngram" and o.speedup > dc.MARGIN for o in options)
    plan = dc.choose_draft(options, dc.AUTO, "balanced")
    assert plan.drafter is None
    assert "no drafted or replayed runs" in plan.line()


def test_ngram_is_chosen_where_its_runs_say_it_pays_and_not_on_free_text() -> None:
    copying = dc.choose_draft(_price({"ngram": COPYING}), dc.AUTO, "balanced")
    assert copying.drafter == "ngram"
    # 3 tokens per step for 1 + 0.2 x 2.5 steps of work
    assert copying.speedup == pytest.approx(3.0 / 1.5)
    assert "draft ngram (auto: 2.00x, learned from 3 runs (3 replayed))" in copying.line()
    free = dc.choose_draft(_price({"ngram": FREE}), dc.AUTO, "balanced")
    assert free.drafter is None and "best ngram 1.01x" in free.line()


def test_too_short_a_history_does_not_draft() -> None:
    """One sampled 64-token reply is too little to go on, however well it replayed."""
    short = replace(COPYING, runs=1, replayed=1, output_tokens=dc.MIN_EVIDENCE_TOKENS - 1)
    plan = dc.choose_draft(_price({"ngram": short}), dc.AUTO, "balanced")
    assert plan.drafter is None
    assert f"{dc.MIN_EVIDENCE_TOKENS - 1} of {dc.MIN_EVIDENCE_TOKENS} tokens seen" in plan.line()
    enough = replace(short, output_tokens=dc.MIN_EVIDENCE_TOKENS)
    assert dc.choose_draft(_price({"ngram": enough}), dc.AUTO, "balanced").drafter == "ngram"


def test_the_row_cost_decides_whether_the_same_acceptance_pays() -> None:
    """A verification row costs what a prompt token costs: cheap beside a slow decode
    (memory-bound), dear where prefill is barely faster than decode."""
    assert dc.row_cost(prefill_s_per_token=0.004, decode_s=0.02) == pytest.approx(0.2)
    assert dc.row_cost(0.0, 0.02) == dc.spec.VERIFY_ROW_COST  # nothing predicted
    assert dc.row_cost(1.0, 0.01) == dc.MAX_ROW_COST
    cheap = dc.choose_draft(_price({"ngram": COPYING}, c_row=0.2), dc.AUTO, "balanced")
    dear = dc.choose_draft(_price({"ngram": COPYING}, c_row=1.0), dc.AUTO, "balanced")
    assert cheap.drafter == "ngram" and dear.drafter is None  # 3 / (1 + 2.5) < 1


def test_a_draft_model_is_chosen_only_when_it_fits_in_the_ram_left() -> None:
    evidence = {"model": DraftEvidence(3, 400, 360, 100, 460)}
    options = _price(evidence, candidates=("ngram", "draft.gguf"))
    model = next(o for o in options if o.drafter == "draft.gguf")
    assert model.memory == DRAFT.spec.tensor_bytes + dc.spec.draft_kv_bytes(DRAFT.spec, 4096)
    assert dc.choose_draft(options, dc.AUTO, "balanced").drafter == "draft.gguf"
    tight = _price(evidence, ram_left=model.memory - 1, candidates=("ngram", "draft.gguf"))
    assert not next(o for o in tight if o.drafter == "draft.gguf").fits
    assert dc.choose_draft(tight, dc.AUTO, "balanced").drafter is None
    # capacity keeps its memory for contexts: only drafters that hold none compete
    assert dc.choose_draft(options, dc.AUTO, "capacity").drafter is None


def test_a_drafter_the_user_names_is_kept_and_priced() -> None:
    options = _price({"ngram": FREE})
    mine = dc.choose_draft(options, "ngram", "balanced")
    assert mine.drafter == "ngram" and mine.asked == "ngram"
    assert "draft ngram (yours: 1.01x" in mine.line()
    assert dc.choose_draft(options, dc.NONE, "balanced").drafter is None


def test_replays_are_ngrams_one_measure_and_teach_ngram_only() -> None:
    """For ngram every run counts in its replay's measure (engine/spec/ngram_replay.py), the
    drafted ones too, whose replays are kept apart for the measured correction; a run
    without a replay (interrupted, or recorded before replays) is left out, its counters
    being another measure. A draft model learns nothing from replays."""
    replay = {"draft_tokens": 10, "draft_accepted": 8, "decode_steps": 20}
    extras = [{"ngram_replay": replay, "output_tokens": 29},
              {"draft": "ngram", "draft_tokens": 6, "draft_accepted": 3, "decode_steps": 9,
               "ngram_replay": {"draft_tokens": 12, "draft_accepted": 9, "decode_steps": 3}},
              {"draft": "ngram", "draft_tokens": 5, "draft_accepted": 4, "decode_steps": 2}]
    ev = pool_evidence(extras, "ngram")
    assert ev is not None
    assert (ev.runs, ev.replayed, ev.draft_tokens, ev.draft_accepted) == (2, 1, 22, 17)
    assert ev.drafted == (12, 9, 3)
    assert pool_evidence(extras, "small.gguf") is None


def test_plan_json_and_line_carry_the_choice() -> None:
    from inferenceos.plan.speculative import PLANNED

    chosen = dc.choose_draft(_price({"ngram": COPYING}), dc.AUTO, "balanced")
    j = chosen.to_json()
    assert j["drafter"] == "ngram" and j["asked"] == "auto"
    assert [o["drafter"] for o in j["options"]] == ["none", "ngram", "self"]
    assert PLANNED == "auto:"  # the engine's spelling of a planned default
    assert replace(chosen, asked="ngram").line().startswith("draft ngram (yours")


def test_once_the_drafter_really_ran_its_measured_speed_corrects_the_replays() -> None:
    """Replays promise acceptance, not time: a drafted run that measured slower than
    the model's plain runs turns auto back to plain decoding at the next plan; the
    correction (measured / what its own counters priced) stays with the evidence, so a
    later workload whose replays promise much more is drafted again."""
    replay = {"draft_tokens": 160, "draft_accepted": 70, "decode_steps": 89}
    plain = [{"ngram_replay": replay, "decode_tps": tps, "output_tokens": 160}
             for tps in (45.6, 45.5, 44.9)]
    promised = pool_evidence(plain, "ngram")
    assert promised is not None and promised.measured is None
    assert promised.speedup(0.2) > dc.MARGIN  # what the replays alone say
    drafted = {"draft": "ngram", "draft_tokens": 229, "draft_accepted": 58,
               "decode_steps": 101, "decode_tps": 42.9, "output_tokens": 160,
               "ngram_replay": {"draft_tokens": 229, "draft_accepted": 58,
                                "decode_steps": 101}}
    ev = pool_evidence([*plain, drafted], "ngram")
    assert ev is not None and ev.measured == pytest.approx(42.9 / 45.5)
    assert ev.drafted == (229, 58, 101)
    assert ev.basis == "learned from 4 runs (3 replayed), measured 0.94x"
    # drafted alone, the answer is the measurement itself
    alone = pool_evidence([drafted, *({"decode_tps": t} for t in (45.6, 45.5))], "ngram")
    assert alone is not None and alone.speedup(0.2) == pytest.approx(42.9 / 45.55)
    assert dc.choose_draft(_price({"ngram": ev}), dc.AUTO, "balanced").drafter is None
    copying = {"draft_tokens": 119, "draft_accepted": 111, "decode_steps": 49}
    later = pool_evidence([*plain, drafted, *({"ngram_replay": copying, "decode_tps": 45.0,
                                               "output_tokens": 160} for _ in range(6))],
                          "ngram")
    assert later is not None
    assert dc.choose_draft(_price({"ngram": later}), dc.AUTO, "balanced").drafter == "ngram"


def test_a_plugin_drafter_is_listed_unpriced_and_left_to_the_engine() -> None:
    options = _price({}, candidates=("ngram", "my-plugin"))
    plugin = next(o for o in options if o.drafter == "my-plugin")
    assert (plugin.speedup, plugin.memory, plugin.learned) == (1.0, 0, False)
    assert dc.choose_draft(options, "my-plugin", "balanced").drafter == "my-plugin"


def test_a_plan_streaming_from_disk_still_drafts_with_what_holds_no_memory() -> None:
    """No RAM left (weights streamed from disk) rules out a draft model or a self-draft,
    never n-gram lookup, which holds nothing."""
    options = _price({"ngram": COPYING, "self": COPYING}, ram_left=-(1 << 20))
    fits = {o.drafter: o.fits for o in options}
    assert fits["ngram"] and not fits["self"]
    assert dc.choose_draft(options, dc.AUTO, "balanced").drafter == "ngram"
    only_self = dc.choose_draft(_price({"self": COPYING}, ram_left=0), dc.AUTO, "balanced")
    assert only_self.drafter is None and "of RAM the plan has not got" in only_self.line()


def test_speeds_compare_one_stream_with_one_stream() -> None:
    """A drafted run served beside other streams is not set against single-stream plain
    runs (nor the reverse): its t/s measures the batch, not the drafter."""
    replay = {"draft_tokens": 50, "draft_accepted": 40, "decode_steps": 60}
    rows = [{"ngram_replay": replay, "decode_tps": 45.0, "concurrency": 1},
            {"ngram_replay": replay, "draft": "ngram", "decode_tps": 20.0, "concurrency": 4}]
    ev = pool_evidence(rows, "ngram")
    assert ev is not None and ev.runs == 2 and ev.measured is None
    rows.append({"ngram_replay": replay, "draft": "ngram", "decode_tps": 70.0,
                 "concurrency": 1})
    ev = pool_evidence(rows, "ngram")
    assert ev is not None and ev.measured == pytest.approx(70.0 / 45.0)


def test_a_draft_file_the_plan_cannot_read_is_left_to_the_engine() -> None:
    def unreadable(path: str) -> dc.ModelFacts:
        raise FileNotFoundError(f"{path}: no such file")

    options = dc.price_drafters(TARGET, ("ngram", "gone.gguf"), 0.2, 4096, 1 << 40,
                                unreadable, _evidence({}))
    gone = next(o for o in options if o.drafter == "gone.gguf")
    assert gone.basis.startswith("not priced: gone.gguf: no such file")
    assert dc.choose_draft(options, "gone.gguf", "balanced").drafter == "gone.gguf"


def test_a_plan_prices_a_draft_context_over_every_slot() -> None:
    """The drafter's KV cache holds every slot's cells, as the target's does
    (engine/drafters.ModelDrafter): four slots of 4096 cost four times one."""
    from inferenceos.plan.entry import LoadRequest, plan_load
    from plan_factories import machine

    facts = make_facts(n_layer=8, n_embd=1024, n_ff=2816, name="target")
    one = plan_load(facts, machine(), LoadRequest(n_ctx=4096, draft="self"))
    four = plan_load(facts, machine(), LoadRequest(n_ctx=4096, n_seq=4, draft="self"))
    assert one.draft is not None and four.draft is not None
    own = dc.spec.self_draft_bytes(facts, dc.SELF_KEEP)
    a, b = one.draft.option("self"), four.draft.option("self")
    assert a is not None and b is not None
    assert a.memory == own + dc.spec.draft_kv_bytes(facts.spec, 4096, dc.SELF_KEEP)
    assert b.memory - own == pytest.approx(4 * (a.memory - own), abs=4)  # int rounding
