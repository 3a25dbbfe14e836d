"""LangChain's OpenAI and Ollama integrations against a real server (tiny models, a
few tokens each): chat invoke and stream, embeddings, and tools bound to a model."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Literal

import jsonschema_rs
import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_ollama import ChatOllama, OllamaEmbeddings
from langchain_openai import ChatOpenAI, OpenAIEmbeddings

from server_harness import TINY_REQUEST, Harness, serving
from tiny_models import write_tiny_model
from tool_templates import TINY_HERMES_TEMPLATE


@tool
def weather(city: Literal["Paris", "Tokyo"]) -> str:
    """Weather now."""
    return f"sunny in {city}"


CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]}},
        "required": ["city"]}


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("server-langchain")
    hermes = write_tiny_model(root / "tiny-hermes.gguf", chat_template=TINY_HERMES_TEMPLATE)
    with serving({"tiny": tiny_llama, "hermes": hermes}, root,
                 manager_kw={"base": replace(TINY_REQUEST, n_ctx=512)}) as h:
        yield h


def _openai(server: Harness, model: str = "tiny", max_tokens: int = 4) -> ChatOpenAI:
    return ChatOpenAI(base_url=server.v1, api_key="unused", model=model,
                      max_tokens=max_tokens, temperature=0, max_retries=0)


def test_chat_openai_invoke_and_stream(server: Harness) -> None:
    llm = _openai(server)
    whole = llm.invoke("hello")
    assert isinstance(whole, AIMessage) and isinstance(whole.content, str)
    assert whole.response_metadata["finish_reason"] in ("stop", "length")
    assert whole.usage_metadata and 0 < whole.usage_metadata["output_tokens"] <= 4
    chunks = list(llm.stream("hello"))
    assert "".join(str(c.content) for c in chunks) == whole.content


def test_openai_embeddings(server: Harness) -> None:
    emb = OpenAIEmbeddings(base_url=server.v1, api_key="unused", model="tiny",
                           check_embedding_ctx_length=False, max_retries=0)
    docs = emb.embed_documents(["red apple", "blue sky"])
    assert len(docs) == 2 and len(docs[0]) == 64 and docs[0] != docs[1]
    assert emb.embed_query("red apple") == pytest.approx(docs[0], abs=1e-5)


def test_chat_ollama_invoke_and_stream(server: Harness) -> None:
    llm = ChatOllama(base_url=server.url, model="tiny", num_predict=4, temperature=0)
    whole = llm.invoke("hello")
    assert isinstance(whole.content, str)
    assert whole.response_metadata["done_reason"] in ("stop", "length")
    chunks = list(llm.stream("hello"))
    assert "".join(str(c.content) for c in chunks) == whole.content


def test_ollama_embeddings(server: Harness) -> None:
    emb = OllamaEmbeddings(base_url=server.url, model="tiny")
    docs = emb.embed_documents(["red apple", "blue sky"])
    assert len(docs) == 2 and len(docs[0]) == 64
    assert emb.embed_query("red apple") == pytest.approx(docs[0], abs=1e-5)


def test_chat_openai_bind_tools_forced_call_and_round_trip(server: Harness) -> None:
    llm = _openai(server, "hermes", 120)
    reply = llm.bind_tools([weather], tool_choice="weather").invoke("weather in paris?")
    assert [c["name"] for c in reply.tool_calls] == ["weather"]
    assert jsonschema_rs.is_valid(CITY, reply.tool_calls[0]["args"])
    result = weather.invoke(reply.tool_calls[0]["args"])
    answer = _openai(server, "hermes", 4).bind_tools([weather]).invoke(
        ["weather in paris?", reply,
         ToolMessage(result, tool_call_id=reply.tool_calls[0]["id"])])
    assert isinstance(answer, AIMessage)


def test_chat_ollama_bind_tools_reply_parsed(server: Harness) -> None:
    """Ollama has no tool_choice: the reply is constrained to the call's JSON (format)
    so that the random model writes one, then parsed into tool_calls."""
    call = {"type": "object", "properties": {"name": {"const": "weather"}, "arguments": CITY},
            "required": ["name", "arguments"]}
    llm = ChatOllama(base_url=server.url, model="hermes", num_predict=120, temperature=0,
                     format=call)
    reply = llm.bind_tools([weather]).invoke("weather in paris?")
    assert [c["name"] for c in reply.tool_calls] == ["weather"]
    assert jsonschema_rs.is_valid(CITY, reply.tool_calls[0]["args"])
