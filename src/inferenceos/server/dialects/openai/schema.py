"""Request and response bodies of the OpenAI-compatible routes (pydantic).

Only what we implement is described; unknown request fields are ignored, as OpenAI's
own clients send fields newer than any server. Fields we accept but cannot honour
are refused with a clear 400 by the routes.
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field, field_validator

from inferenceos.server.errors import Dialect, error_responses
from inferenceos.server.tool_schema import ToolDef

Role = Literal["system", "user", "assistant", "tool", "developer", "function"]


class MediaURL(BaseModel):
    url: str = Field(..., max_length=64 * 1024 * 1024)
    detail: str | None = None  # accepted, not used (the projector decides the resolution)


class InputAudio(BaseModel):
    data: str  # base64
    format: str | None = Field(None, max_length=20)  # wav, mp3 (flac accepted)


class ContentPart(BaseModel):
    """A message content part: `text`, `image_url` (data: URL; http(s) when the server
    fetches), `input_audio` (base64 WAV / MP3 / FLAC), or `video_url` (an animated GIF /
    WebP, sampled into frames). Media parts are decoded by server/media_parts.py."""

    type: str
    text: str | None = None
    image_url: MediaURL | str | None = None
    input_audio: InputAudio | None = None
    video_url: MediaURL | str | None = None


class FunctionCallIn(BaseModel):
    name: str = Field(..., min_length=1, max_length=128)
    arguments: str | dict[str, Any] | None = None  # JSON text (OpenAI); an object is accepted


class ToolCallIn(BaseModel):
    """A call the assistant made earlier in the conversation."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(BaseModel):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant messages
    tool_call_id: str | None = None  # tool messages: the call they answer


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """`tool_choice` naming the one function the reply must call."""

    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(BaseModel):
    include_usage: bool = False


class ResponseFormat(BaseModel):
    type: str = "text"
    json_schema: dict[str, Any] | None = None
    # llama.cpp extension: {"type": "json_object", "schema": {...}} constrains to a schema
    schema_: Any = Field(None, alias="schema")


class SamplingFields(BaseModel):
    """Fields common to chat and text completions."""

    model: str = Field("", max_length=200)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0, description="llama.cpp extension")
    min_p: float | None = Field(None, ge=0, le=1, description="llama.cpp extension")
    repeat_penalty: float | None = Field(None, gt=0, description="llama.cpp extension")
    n: int = Field(1, ge=1, le=8)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**32 - 1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    grammar: str | None = Field(None, description="llama.cpp extension: a GBNF grammar")
    json_schema: Any = Field(None, description="llama.cpp extension: a JSON schema")
    draft: str | None = Field(None, max_length=64,
                              description="InferenceOS extension: drafter (ngram, none)")
    return_progress: bool = Field(False, description="llama.cpp extension: with `stream`, "
                                  "chunks carrying `prompt_progress` while the prompt is "
                                  "processed")
    structured_outputs: dict[str, Any] | None = Field(
        None, description="vLLM: one of {json, regex, choice, grammar} constrains the output")
    guided_json: Any = Field(None, description="vLLM (older spelling): a JSON schema")
    guided_regex: str | None = Field(None, description="vLLM (older spelling): a regex")
    guided_choice: list[str] | None = Field(None, description="vLLM (older spelling): "
                                            "the output is one of these strings")
    guided_grammar: str | None = Field(None, description="vLLM (older spelling): GBNF")

    @field_validator("model", mode="before")
    @classmethod
    def _null_model(cls, v: Any) -> Any:
        """`"model": null` is the default model, as llama-server takes it."""
        return "" if v is None else v


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessageIn] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[ToolDef] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = Field(
        None, description="Let a forced reply hold several calls (default false, as llama-server)")
    verbose: bool = Field(False, description="llama.cpp extension: add `__verbose` (the "
                          "rendered prompt, timings) to a non-streamed reply")
    reasoning_format: str | None = Field(None, max_length=32, description=(
        "llama.cpp: none (reasoning left in content), deepseek or auto (reasoning in "
        "reasoning_content, the default)"))
    chat_template_kwargs: dict[str, Any] | None = Field(None, description=(
        "llama.cpp / vLLM: variables for the chat template (enable_thinking...)"))
    reasoning_effort: str | None = Field(None, max_length=32, description=(
        "none turns thinking off; another level reaches the template as reasoning_effort"))
    reasoning_budget_tokens: int | None = Field(None, description=(
        "llama.cpp: tokens of reasoning allowed (-1 unrestricted, 0 off)"))
    thinking_budget_tokens: int | None = Field(None, description=(
        "llama.cpp: another name for reasoning_budget_tokens"))
    reasoning_budget_message: str | None = Field(None, max_length=4096, description=(
        "llama.cpp: text written before the forced end of reasoning"))
    add_generation_prompt: bool = Field(True, description="llama.cpp / vLLM: only true")
    continue_final_message: bool = Field(False, description="llama.cpp / vLLM: only false")


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(..., min_length=1)
    max_tokens: int | None = Field(16, ge=0)
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = Field(None, ge=0, le=5)
    best_of: int | None = Field(None, ge=1, le=8)
    response_format: ResponseFormat | None = Field(None, description="llama.cpp extension")


class EmbeddingText(BaseModel):
    """llama.cpp extension: a text given as `{"prompt_string": ...}` or as text parts."""

    prompt_string: str | None = None
    content: list[ContentPart] | None = None


class EmbeddingRequest(BaseModel):
    model: str = Field("", max_length=200)
    # text, token ids, or (llama.cpp) ids and text mixed, text objects; or a list of those
    input: str | EmbeddingText | list[int | str | EmbeddingText | list[int | str]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens reused from the KV cache


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class FunctionCallOut(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None  # as llama-server and DeepSeek return it
    tool_calls: list[ToolCallOut] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float  # the model's raw distribution; -9999 for "too unlikely to say"
    bytes: list[int] | None = None


class TokenLogprobOut(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobOut] | None
    refusal: list[TokenLogprobOut] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


ChoiceT = TypeVar("ChoiceT", bound=BaseModel)


class Reply(BaseModel, Generic[ChoiceT]):
    """The fields a chat completion, a chunk of one and a text completion share, in the
    order they are sent; each names its `object` (and may require `usage`)."""

    id: str
    object: str
    created: int
    model: str
    choices: list[ChoiceT]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ChatCompletion(Reply[ChatChoice]):
    object: Literal["chat.completion"] = "chat.completion"
    usage: Usage
    timings: dict[str, Any] | None = Field(None, description="llama.cpp extension: "
                                             "prompt and generation speeds")


class ToolCallDelta(ToolCallOut):
    """A whole call in one streamed delta (sent once the reply is complete)."""

    index: int


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None  # the tokens of this chunk


class ChatCompletionChunk(Reply[ChunkChoice]):
    """One `data:` event of a streamed chat completion (the stream ends `data: [DONE]`)."""

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"


class CompletionLogprobs(BaseModel):
    """The legacy shape: parallel lists, one item per generated token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class Completion(Reply[CompletionChoice]):
    """A text completion; streamed as `data:` events of this shape with partial `text`."""

    object: Literal["text_completion"] = "text_completion"
    timings: dict[str, Any] | None = Field(None, description="llama.cpp extension: "
                                             "prompt and generation speeds")


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "inferenceos"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


ERROR_RESPONSES = error_responses(ErrorResponse, Dialect.OPENAI)
