"""End to end on the real Gemma 3 270M: both clients, streamed, through a real server."""

from __future__ import annotations

from pathlib import Path

import ollama
import openai
import pytest

from inferenceos.plan.entry import LoadRequest
from server_harness import start_server


@pytest.mark.slow
def test_gemma_through_both_apis(gemma_path: Path, tmp_path: Path) -> None:
    h = start_server({"gemma3-270m": gemma_path}, tmp_path,
                     manager_kw={"base": LoadRequest(n_ctx=1024)})
    try:
        oa = openai.OpenAI(base_url=h.v1, api_key="x", max_retries=0, timeout=120)
        stream = oa.completions.create(model="gemma3-270m", prompt="The capital of France is",
                                       max_tokens=8, temperature=0, stream=True)
        text = "".join(c.choices[0].text for c in stream if c.choices)
        assert text.strip()  # a base model: it continues the sentence its own way
        r = ollama.Client(host=h.url, timeout=120).generate(
            model="gemma3-270m", prompt="The capital of France is", raw=True,
            options={"num_predict": 8, "temperature": 0})
        assert r.response == text and r.eval_count and r.eval_duration
        assert r.eval_count / (r.eval_duration / 1e9) > 1  # tokens per second, sane
    finally:
        h.stop()
