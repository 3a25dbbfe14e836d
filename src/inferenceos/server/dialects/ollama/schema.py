"""Request and response bodies of the Ollama-compatible routes (pydantic).

Field names and types follow Ollama's API (and its Python client's models). Durations
are integers in nanoseconds; times are RFC 3339 strings.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from inferenceos.server.errors import Dialect, error_responses
from inferenceos.server.tool_schema import ToolDef

KeepAlive = str | float | None
Options = dict[str, Any] | None


class OllamaFunctionCall(BaseModel):
    name: str = Field(..., min_length=1, max_length=128)
    arguments: dict[str, Any] = Field(default_factory=dict)
    index: int | None = None


class OllamaToolCall(BaseModel):
    function: OllamaFunctionCall


class OllamaMessage(BaseModel):
    role: str
    content: str | None = ""
    images: list[str] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None  # tool messages: the tool that answered


class GenerateRequest(BaseModel):
    model: str = Field("", max_length=200)
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    images: list[str] | None = None
    format: str | dict[str, Any] | None = None
    options: Options = None
    stream: bool = True
    raw: bool = False
    keep_alive: KeepAlive = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)


class ChatRequest(BaseModel):
    model: str = Field("", max_length=200)
    messages: list[OllamaMessage] | None = None
    tools: list[ToolDef] | None = Field(None, max_length=128)
    format: str | dict[str, Any] | None = None
    options: Options = None
    stream: bool = True
    keep_alive: KeepAlive = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)


class EmbedRequest(BaseModel):
    model: str = Field("", max_length=200)
    input: str | list[str] = ""
    truncate: bool = True
    options: Options = None
    keep_alive: KeepAlive = None
    dimensions: int | None = None


class EmbeddingsRequest(BaseModel):
    model: str = Field("", max_length=200)
    prompt: str = ""
    options: Options = None
    keep_alive: KeepAlive = None


class NameRequest(BaseModel):
    """`model` (current) or `name` (older clients) names the model."""

    model: str | None = Field(None, max_length=200)
    name: str | None = Field(None, max_length=200)

    def target(self) -> str:
        return (self.model or self.name or "").strip()


class ShowRequest(NameRequest):
    verbose: bool = False


class PullRequest(NameRequest):
    insecure: bool = False
    stream: bool = True


class CopyRequest(BaseModel):
    source: str = Field(..., max_length=200)
    destination: str = Field(..., max_length=200)


class TokenLogprobOut(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class LogprobOut(TokenLogprobOut):
    top_logprobs: list[TokenLogprobOut] | None = None


class Timings(BaseModel):
    model: str
    created_at: str
    done: bool
    logprobs: list[LogprobOut] | None = None  # when asked: the tokens of this line
    done_reason: str | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_cached_count: int | None = None  # of prompt_eval_count, from the KV cache
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None


class GenerateResponse(Timings):
    """Also the shape of each NDJSON line when streaming (done true on the last)."""

    response: str
    thinking: str | None = None  # the reasoning, apart (think)
    context: list[int] | None = None


class MessageOut(BaseModel):
    role: str = "assistant"
    content: str
    thinking: str | None = None  # the reasoning, apart (think)
    tool_calls: list[OllamaToolCall] | None = None


class ChatResponse(Timings):
    """Also the shape of each NDJSON line when streaming (done true on the last)."""

    message: MessageOut


class EmbedResponse(BaseModel):
    model: str
    embeddings: list[list[float]]
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None


class EmbeddingsResponse(BaseModel):
    embedding: list[float]


class ModelDetails(BaseModel):
    parent_model: str = ""
    format: str = "gguf"
    family: str
    families: list[str]
    parameter_size: str
    quantization_level: str


class TagModel(BaseModel):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: ModelDetails


class TagsResponse(BaseModel):
    models: list[TagModel]


class PsModel(BaseModel):
    name: str
    model: str
    size: int
    digest: str
    details: ModelDetails
    expires_at: str
    size_vram: int
    context_length: int
    # ours, beside Ollama's: the tier, the plan's charge per device and why
    state: str = "hot"
    pinned: bool = False
    slots: int = 1
    memory_by_device: dict[str, int] = {}
    reason: str = ""
    kv_cache_ram: int = 0  # of memory_by_device's CPU: the KV cache's RAM tier budget


class PsResponse(BaseModel):
    models: list[PsModel]


class ShowResponse(BaseModel):
    modelfile: str
    parameters: str
    template: str
    system: str | None = None  # a preset's SYSTEM (registry/presets.py)
    details: ModelDetails
    model_info: dict[str, Any]
    projector_info: dict[str, Any] | None = None  # the mmproj's metadata, when it has one
    capabilities: list[str]
    modified_at: str


class StatusResponse(BaseModel):
    status: str


class VersionResponse(BaseModel):
    version: str
    inferenceos: str | None = None


class OllamaError(BaseModel):
    error: str


ERRORS = error_responses(OllamaError, Dialect.OLLAMA)
