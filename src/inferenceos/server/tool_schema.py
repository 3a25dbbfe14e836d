"""Tool definitions as both APIs send them (OpenAI's shape; Ollama uses the same)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class FunctionDef(BaseModel):
    """A function the model may call; `parameters` is a JSON Schema (an object)."""

    name: str = Field(..., min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDef

    def for_template(self) -> dict[str, Any]:
        """The Hugging Face shape chat templates render (no null fields)."""
        return {"type": "function", "function": self.function.model_dump(exclude_none=True)}
