"""llama-server's LoRA routes on our server (tiny llama, real HTTP): GET/POST
/lora-adapters, per-request `lora`, 400 for an unknown id; one adapter's text is its
own whatever else the batch holds (engine/lora.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferenceos.server.settings import ServerSettings
from lora_craft import write_lora
from server_harness import Harness, serving


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("lora-server")
    adapter = write_lora(root / "a.gguf", tiny_llama, seed=1, magnitude=0.3)
    settings = replace(ServerSettings(), lora=((str(adapter), 1.0),))
    with serving({"tiny": tiny_llama}, root, settings=settings) as h:
        yield h


def complete(h: Harness, **extra: Any) -> httpx.Response:
    return httpx.post(f"{h.url}/completion", json={
        "prompt": "a b c", "n_predict": 12, "temperature": 0, **extra}, timeout=60)


def test_lora_adapters_routes_and_per_request_scales(server: Harness) -> None:
    listed = httpx.get(f"{server.url}/lora-adapters").json()
    assert [(a["id"], a["scale"]) for a in listed] == [(0, 1.0)]
    assert listed[0]["path"].endswith("a.gguf")
    with_adapter = complete(server).json()["content"]
    base = complete(server, lora=[{"id": 0, "scale": 0}]).json()["content"]
    assert with_adapter != base
    assert complete(server, lora=[]).json()["content"] == with_adapter  # [] = global
    bad = complete(server, lora=[{"id": 3, "scale": 1}])
    assert bad.status_code == 400 and "invalid adapter id 3" in bad.json()["error"]["message"]
    assert complete(server, lora=[{"id": "x"}]).status_code == 400
    r = httpx.post(f"{server.url}/lora-adapters", json=[{"id": 0, "scale": 0.0}])
    assert r.json() == {"success": True}
    try:
        assert complete(server).json()["content"] == base
        assert httpx.get(f"{server.url}/lora-adapters").json()[0]["scale"] == 0.0
    finally:
        httpx.post(f"{server.url}/lora-adapters", json=[{"id": 0, "scale": 1.0}])
    assert httpx.post(f"{server.url}/lora-adapters", json={"id": 0}).status_code == 400
