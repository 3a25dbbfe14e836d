"""Request bodies of OpenAI's Responses API (`POST /v1/responses`) and of sessions.

Only what we implement is described; unknown fields are ignored (clients send fields
newer than any server). Fields accepted but not honoured are refused by the routes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class InputPart(BaseModel):
    """A content part: `input_text` / `output_text` (text), `input_image` (`image_url`
    as a data: URL, or http(s) when the server fetches) and `input_audio` (`{"data":
    base64, "format"}`); others are refused."""

    type: str
    text: str | None = None
    image_url: str | dict[str, Any] | None = None
    file_id: str | None = None
    detail: str | None = None
    input_audio: dict[str, Any] | None = None


class InputItem(BaseModel):
    """One input item: a message (`{"role", "content"}`, `type` "message" or absent),
    an earlier `function_call` (`call_id`, `name`, `arguments` as JSON text), or a
    `function_call_output` (`call_id`, `output`)."""

    type: str | None = None
    role: str | None = None
    content: str | list[InputPart] | None = None
    call_id: str | None = Field(None, max_length=200)
    name: str | None = Field(None, max_length=128)
    arguments: str | None = None
    output: str | None = None


class TextFormat(BaseModel):
    type: str = "text"  # text, json_object, json_schema
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    format: TextFormat | None = None


class ReasoningIn(BaseModel):
    """`reasoning`: `effort` "none" turns thinking off; another level reaches the
    template as `reasoning_effort`. `summary` is accepted (the reasoning comes whole)."""

    effort: str | None = Field(None, max_length=32)
    summary: str | None = Field(None, max_length=32)


class ResponseRequest(BaseModel):
    """`client.responses.create(...)`."""

    model: str = Field("", max_length=200)
    input: str | list[InputItem]
    reasoning: ReasoningIn | None = None
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0, description="llama.cpp extension")
    min_p: float | None = Field(None, ge=0, le=1, description="llama.cpp extension")
    seed: int | None = Field(None, ge=0, lt=2**32 - 1, description="llama.cpp extension")
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = Field(None, max_length=100)
    text: TextConfig | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None


class SessionCreate(BaseModel):
    """`POST /v1/sessions`: a conversation kept on the server, KV state included."""

    model: str = Field("", max_length=200)
    system: str | None = None
    metadata: dict[str, str] | None = None


class SessionMessage(BaseModel):
    """`POST /v1/sessions/{id}/messages`: the next user turn."""

    content: str = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=0, lt=2**32 - 1)
    stop: str | list[str] | None = None
    stream: bool = False
