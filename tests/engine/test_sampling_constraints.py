"""Grammar-constrained output and logit bias, on real llama.cpp with a tiny model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferenceos.engine.sampling import SamplingParams, grammar_from_json_schema
from inferenceos.engine.scheduler import generate_one
from inferenceos.engine.session import LoadedModel
from inferenceos.errors import UsageError
from inferenceos.plan.llama_params import LlamaParams


@pytest.fixture(scope="module")
def lm(tiny_llama: Path) -> Iterator[LoadedModel]:
    with LoadedModel(tiny_llama, LlamaParams(n_ctx=512, n_batch=64, n_threads=1)) as m:
        yield m


def complete(lm: LoadedModel, **kw: object) -> str:
    params = SamplingParams(**{"temperature": 0, "max_tokens": 40, **kw})  # type: ignore[arg-type]
    return "".join(ev.text for ev in generate_one(lm, lm.tokenize("abc"), params))


def test_gbnf_grammar_constrains_every_token(lm: LoadedModel) -> None:
    free = complete(lm, max_tokens=20)
    assert set(free) - set("ab"), "unconstrained output uses other characters"
    text = complete(lm, max_tokens=20, grammar='root ::= [ab]+ "."')
    assert text and set(text) <= set("ab.")


def test_json_schema_output_parses_and_validates(lm: LoadedModel) -> None:
    schema = {"type": "object", "properties": {"c": {"enum": ["red", "blue"]}},
              "required": ["c"]}
    grammar = grammar_from_json_schema(json.dumps(schema))
    text = complete(lm, max_tokens=60, grammar=grammar)
    assert lm.metrics.stop_reason == "eos"  # the grammar ended the output
    assert json.loads(text)["c"] in ("red", "blue")


def test_bad_grammar_is_a_user_error(lm: LoadedModel) -> None:
    with pytest.raises(UsageError, match="grammar does not parse"):
        complete(lm, grammar="root ::= [unterminated")


def test_logit_bias_bans_the_greedy_choice(lm: LoadedModel) -> None:
    first = next(iter(generate_one(lm, lm.tokenize("abc"), SamplingParams(temperature=0))))
    banned = SamplingParams(temperature=0, logit_bias=((first.token, float("-inf")),))
    other = next(iter(generate_one(lm, lm.tokenize("abc"), banned)))
    assert other.token != first.token


def test_logit_bias_outside_the_vocabulary_is_refused(lm: LoadedModel) -> None:
    with pytest.raises(UsageError, match="vocabulary has 287"):
        complete(lm, logit_bias=((10_000, 1.0),))


def test_repetition_penalty_changes_a_repetitive_greedy_output(lm: LoadedModel) -> None:
    plain = complete(lm, max_tokens=40)
    penalised = complete(lm, max_tokens=40, repeat_penalty=1.8, repeat_last_n=64)
    assert penalised != plain
    freq = complete(lm, max_tokens=40, frequency_penalty=1.0, presence_penalty=1.0)
    assert freq != plain


def test_lazy_grammar_applies_only_after_its_trigger(lm: LoadedModel) -> None:
    """With a trigger pattern the output is free until the trigger appears, then the
    grammar holds from the trigger's group on (how a tool call is constrained in
    `auto` mode without forcing one)."""
    a_token = lm.tokenize("a", add_special=False)[-1]
    texts = [
        complete(lm, temperature=1.0, seed=seed, max_tokens=40, grammar='root ::= "a" [xyz]+',
                 grammar_triggers=(r"[\s\S]*?(a)[\s\S]*",), logit_bias=((a_token, 4.0),))
        for seed in range(4)
    ]
    free = [t for t in texts if "a" in t and t.index("a") > 0]
    assert free, texts  # some output was free before the trigger
    for text in texts:
        _, trigger, tail = text.partition("a")
        assert trigger, text  # the bias makes the trigger appear
        assert tail and set(tail) <= set("xyz"), text  # the grammar held after it
    # without the trigger the grammar would constrain from the first token
    eager = complete(lm, temperature=1.0, seed=0, max_tokens=40, grammar='root ::= "a" [xyz]+')
    assert eager.startswith("a")
