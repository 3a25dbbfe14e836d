"""Many models in one memory budget, through a real server and real tiny models: the
budget holds two; a third request evicts the least recently used; every request
succeeds; /api/ps reports the plan's own figures and each model's tier; a pinned model
stays; a load that cannot fit gets 503 with the figures; two hot models answer at once."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest

from cli_helpers import run_main
from inferenceos.plan.entry import LoadRequest
from inferenceos.registry.budget import MemoryBudget
from server_harness import serving
from tiny_models import write_tiny_model


def _models(root: Path) -> dict[str, Path]:
    return {n: write_tiny_model(root / f"{n}.gguf", seed=i) for i, n in enumerate("abc")}


def _hot_charge(h: object, name: str) -> int:
    return sum(h.manager.plan_for(name).charge().values())  # type: ignore[attr-defined]


def _ps(h: object) -> dict[str, dict]:
    data = httpx.get(h.url + "/api/ps", timeout=10).json()  # type: ignore[attr-defined]
    return {m["name"].split(":")[0]: m for m in data["models"]}


def _gen(h: object, name: str, n: int = 4) -> str:
    r = httpx.post(h.url + "/api/generate", timeout=60,  # type: ignore[attr-defined]
                   json={"model": name, "prompt": "ab", "stream": False,
                         "options": {"num_predict": n, "temperature": 0}})
    assert r.status_code == 200, r.text
    return str(r.json()["response"])


def test_two_fit_a_third_evicts_lru_and_ps_reports_plan_figures(tmp_path: Path) -> None:
    models = _models(tmp_path)
    with serving(models, tmp_path) as h:
        hot = _hot_charge(h, "a")
        h.manager.budget = MemoryBudget(total_cap=2 * hot + hot // 4)
        for name in ("a", "b"):
            _gen(h, name)
        ps = _ps(h)
        assert {k: v["state"] for k, v in ps.items()} == {"a": "hot", "b": "hot"}
        for name, entry in ps.items():
            plan = h.manager.plan_for(name)
            assert entry["memory_by_device"] == plan.charge()
            assert entry["size"] == sum(plan.charge().values()) and entry["size_vram"] == 0
        _gen(h, "c")  # a is the least recently used: it gives way first
        ps = _ps(h)
        assert ps["c"]["state"] == "hot" and ps.get("b", {}).get("state") in ("hot", "warm")
        assert "a" not in ps or ps["a"]["state"] == "warm"
        assert sum(e["size"] for e in ps.values()) <= 2 * hot + hot // 4
        _gen(h, "a")  # and every request succeeds


def test_pinned_model_stays_and_an_impossible_load_is_503_with_figures(tmp_path: Path) -> None:
    models = _models(tmp_path)
    with serving(models, tmp_path, manager_kw={"pinned": ["a:latest"]}) as h:
        hot = _hot_charge(h, "a")
        h.manager.budget = MemoryBudget(total_cap=hot + hot // 2)
        _gen(h, "a")
        r = httpx.post(h.url + "/api/generate", timeout=60,
                       json={"model": "b", "prompt": "ab", "stream": False})
        assert r.status_code == 503
        err = r.json()["error"]
        assert "cannot load 'b:latest'" in err and "pinned" in err and "short by" in err
        assert _ps(h)["a"]["state"] == "hot" and _ps(h)["a"]["pinned"]


def test_two_hot_models_answer_concurrently(tmp_path: Path) -> None:
    """Each hot model has its own worker, and nothing serialises requests across
    models: while a request holds model a (a lease, as a long generation does), a
    request to b is answered, and a streams on as well."""
    from inferenceos.engine.sampling import SamplingParams

    models = _models(tmp_path)
    with serving(models, tmp_path) as h:
        _gen(h, "b", 1)
        with h.manager.acquire("a") as lease_a:
            stream = lease_a.engine.generate(
                "ab", SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
            events = iter(stream)
            next(events)  # a is generating now
            done = threading.Event()
            threading.Thread(target=lambda: (_gen(h, "b", 8), done.set()), daemon=True).start()
            assert done.wait(30), "a request to b waited for a"
            assert sum(1 for _ in events) > 0
            pids = {lm.model.name: lm.engine.worker_pid for lm in h.manager.loaded()}
        assert len(set(pids.values())) == 2


def test_ps_cli_shows_state_memory_context_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    models = _models(tmp_path)
    with serving(models, tmp_path, manager_kw={"pinned": ["a:latest"]}) as h:
        _gen(h, "a")
        code, out, _ = run_main(["ps", "--port", str(h.port), "--json"], capsys, monkeypatch)
        assert code == 0
        (entry,) = json.loads(out)["models"]
        assert entry["state"] == "hot" and entry["pinned"] and entry["slots"] == 1
        assert entry["memory_by_device"]["CPU"] == entry["size"] > 0
        assert entry["reason"].startswith("--ctx 256; plan: ctx 256")
        code, out, _ = run_main(["ps", "--port", str(h.port)], capsys, monkeypatch)
        assert code == 0
        for text in ("a:latest", "hot (pinned)", "CPU", "256 × 1", "plan: ctx 256"):
            assert text in out, out


def test_kv_types_and_policy_per_request(tmp_path: Path) -> None:
    """Ollama options `cache_type_k`/`cache_type_v` re-plan the model with those KV
    types; `kv_policy` picks the request's eviction policy; bad values are 400s."""
    models = {"a": write_tiny_model(tmp_path / "a.gguf")}
    with serving(models, tmp_path) as h:
        r = httpx.post(h.url + "/api/generate", timeout=60, json={
            "model": "a", "prompt": "ab", "stream": False,
            "options": {"num_predict": 4, "cache_type_k": "f32", "kv_policy": "streaming"}})
        assert r.status_code == 200, r.text
        (lm,) = h.manager.loaded()
        assert lm.settings.type_k == "f32" and lm.settings.type_v == "f16"
        for bad in ({"cache_type_k": "q3"}, {"kv_policy": "../x"}, {"kv_policy": "nope"}):
            r = httpx.post(h.url + "/api/generate", timeout=60, json={
                "model": "a", "prompt": "ab", "stream": False, "options": bad})
            assert r.status_code == 400, (bad, r.text)


def test_context_grows_for_a_prompt_that_does_not_fit(tmp_path: Path) -> None:
    """A model started small (from its recorded traffic) is resized, not refused, when a
    prompt needs more; the reason says so. With a pinned num_ctx it is refused."""
    models = {"a": write_tiny_model(tmp_path / "a.gguf", letters_only=True)}
    kw = {"base": LoadRequest(threads=1, n_batch=64),
          "context_hint": lambda model: (128, "p95 of 5 recorded requests is 90 tokens")}
    with serving(models, tmp_path, manager_kw=kw) as h:
        _gen(h, "a")
        assert _ps(h)["a"]["context_length"] == 128
        long = "ab " * 100  # ~200 tokens on the tiny vocabulary
        r = httpx.post(h.url + "/api/generate", timeout=60, json={
            "model": "a", "prompt": long, "stream": False, "options": {"num_predict": 4}})
        assert r.status_code == 200, r.text
        entry = _ps(h)["a"]
        assert entry["context_length"] == 512 and "grown for a prompt" in entry["reason"]
        r = httpx.post(h.url + "/api/generate", timeout=60, json={
            "model": "a", "prompt": long, "stream": False,
            "options": {"num_predict": 4, "num_ctx": 128}})
        assert r.status_code == 400 and "a sequence holds" in r.text


def test_a_draft_model_is_charged_to_its_model(tmp_path: Path) -> None:
    """serve --draft MODEL.gguf: the drafter's weights and KV live in the model's worker
    and count in its charge (what /api/ps reports and eviction weighs)."""
    from inferenceos.registry.manager import engine_factory

    models = {"a": write_tiny_model(tmp_path / "a.gguf")}
    draft = write_tiny_model(tmp_path / "draft.gguf", seed=3)
    with serving(models, tmp_path,
                 manager_kw={"factory": engine_factory(8, draft=str(draft))}) as h:
        _gen(h, "a", 8)
        (lm,) = h.manager.loaded()
        assert lm.extra["CPU"] > 0
        entry = _ps(h)["a"]
        assert entry["size"] == sum(lm.plan.charge().values()) + lm.extra["CPU"]
