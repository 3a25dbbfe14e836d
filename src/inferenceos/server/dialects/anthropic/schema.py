"""Request and response bodies of Anthropic's Messages API (`POST /v1/messages`,
`POST /v1/messages/count_tokens`), as pydantic models.

Field names follow Anthropic's reference. Request content blocks are one permissive
model (`type` plus the fields each type uses): the route reads the types it serves and
refuses the others with a 400 naming the type, rather than pydantic's union errors.
Unknown request fields are ignored (SDKs send fields newer than any server); response
models describe exactly what the routes return (the schemathesis run checks them).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from inferenceos.server.errors import Dialect, error_responses

MAX_TOOLS = 128


class ImageSource(BaseModel):
    """`{"type": "base64", "media_type", "data"}` or `{"type": "url", "url"}`."""

    type: str
    media_type: str | None = Field(None, max_length=100)
    data: str | None = None
    url: str | None = Field(None, max_length=64 * 1024 * 1024)


class ContentBlockIn(BaseModel):
    """One content block of a request message (or of the `system` list, or of a
    `tool_result`'s `content`): `text`, `image`, `tool_use` (an earlier call:
    `id`, `name`, `input`), `tool_result` (`tool_use_id`, `content`, `is_error`),
    `thinking` / `redacted_thinking` (earlier reasoning: dropped, as chat templates
    drop it). `cache_control` and `citations` are accepted and ignored."""

    type: str = Field(..., max_length=64)
    text: str | None = None
    source: ImageSource | None = None
    id: str | None = Field(None, max_length=200)
    name: str | None = Field(None, max_length=128)
    input: dict[str, Any] | None = None
    tool_use_id: str | None = Field(None, max_length=200)
    content: str | list[ContentBlockIn] | None = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    cache_control: dict[str, Any] | None = None
    citations: Any = None


class MessageIn(BaseModel):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlockIn]


class ToolIn(BaseModel):
    """A client tool (`name`, `description`, `input_schema`); `type` is absent or
    "custom". Anthropic's server tools (web search, code execution...) carry another
    `type` and are refused by the route."""

    name: str = Field(..., min_length=1, max_length=128)
    type: str | None = Field(None, max_length=64)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoiceIn(BaseModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(None, max_length=128)
    disable_parallel_tool_use: bool | None = None


class ThinkingIn(BaseModel):
    """`{"type": "enabled", "budget_tokens"}`: think within that many tokens (the
    section is closed after them); `{"type": "disabled"}`: no thinking, the way the
    template allows; adaptive: as the template does (server/reasoning.py)."""

    type: str = Field(..., max_length=32)
    budget_tokens: int | None = Field(None, ge=0)


class OutputFormatIn(BaseModel):
    """Structured outputs: `{"type": "json_schema", "schema"}` (enforced by a grammar)."""

    type: str = Field(..., max_length=32)
    schema_: dict[str, Any] | None = Field(None, alias="schema")


class OutputConfigIn(BaseModel):
    """`output_config`: `format` is honoured; `effort` is accepted and ignored."""

    format: OutputFormatIn | None = None
    effort: str | None = Field(None, max_length=16)


class CountTokensRequest(BaseModel):
    """`client.messages.count_tokens(...)`."""

    model: str = Field("", max_length=200)
    messages: list[MessageIn] = Field(..., min_length=1)
    system: str | list[ContentBlockIn] | None = None
    tools: list[ToolIn] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoiceIn | None = None
    thinking: ThinkingIn | None = None


class MessagesRequest(CountTokensRequest):
    """`client.messages.create(...)` / `client.messages.stream(...)`."""

    max_tokens: int = Field(..., ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    output_config: OutputConfigIn | None = None


# -- responses ----------------------------------------------------------------------


class TextBlock(BaseModel):
    type: Literal["text"]
    text: str


class ThinkingBlock(BaseModel):
    type: Literal["thinking"]
    thinking: str
    signature: str


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class Usage(BaseModel):
    """`input_tokens` excludes the prompt tokens reused from the KV cache, which are
    `cache_read_input_tokens` (their sum is the whole prompt), as Anthropic counts."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int


class Message(BaseModel):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[TextBlock | ThinkingBlock | ToolUseBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use",
                         "model_context_window_exceeded"] | None
    stop_sequence: str | None
    usage: Usage


class TokensCount(BaseModel):
    input_tokens: int


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorResponse(BaseModel):
    """Anthropic's error shape: `{"type": "error", "error": {"type", "message"},
    "request_id"}`."""

    type: Literal["error"]
    error: ErrorDetail
    request_id: str | None = None


ERROR_RESPONSES = error_responses(ErrorResponse, Dialect.ANTHROPIC)
