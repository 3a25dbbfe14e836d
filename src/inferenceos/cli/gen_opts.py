"""The generation options `run` and `serve` share, as Annotated aliases, and the typed
groups a command builds from them.

An alias keeps a flag's spelling and help text in one place (docs/cli.md is the
contract); a command's signature names the aliases, so the flags and their order in
`--help` stay as they were. The groups are frozen: a command builds each once from its
parameters and hands it on whole, instead of threading thirty loose values through its
helpers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from inferenceos.cli.plan_opts import draft_choice, flash_attn_choice, load_request

if TYPE_CHECKING:
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.plan.entry import LoadRequest

# run's prompt and its shape
RunModelArg = Annotated[
    str, typer.Argument(help="Path to a .gguf file (default: built-in Gemma 3 270M)")]
PromptOpt = Annotated[
    str | None, typer.Option("--prompt", "-p", help="Prompt text (else read from stdin)")]
SystemOpt = Annotated[str | None, typer.Option("--system", help="System message")]
RawOpt = Annotated[
    bool, typer.Option("--raw", help="Send the prompt as is, without the chat template")]
TemplateOpt = Annotated[str | None, typer.Option(
    "--template", help="Use llama.cpp's built-in chat template NAME (e.g. gemma)")]
ImageOpt = Annotated[list[Path] | None, typer.Option(
    "--image", help="An image file to show the model (repeatable; needs a projector)")]
AudioOpt = Annotated[list[Path] | None, typer.Option(
    "--audio", help="An audio file (WAV, MP3, FLAC) for a model whose projector hears")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object at the end")]
VerboseLogOpt = Annotated[
    bool, typer.Option("--verbose", "-v", help="Show llama.cpp's log")]

# sampling
MaxTokensOpt = Annotated[
    int, typer.Option("--max-tokens", "-n", help="Most tokens to generate")]
TemperatureOpt = Annotated[float, typer.Option("--temperature", "-t", help="0 = greedy")]
TopKOpt = Annotated[int, typer.Option("--top-k")]
TopPOpt = Annotated[float, typer.Option("--top-p")]
MinPOpt = Annotated[float, typer.Option("--min-p")]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Fix the sampling seed")]
LoraOpt = Annotated[list[str] | None, typer.Option(
    "--lora", help="LoRA adapter GGUF, FILE[:SCALE] (scale 1 by default; repeatable)")]
ReasoningBudgetOpt = Annotated[int, typer.Option(
    "--reasoning-budget", min=-1, help="Tokens of reasoning a reply of a thinking model may "
    "write: -1 unrestricted, 0 thinking off, N the section is closed after N tokens "
    "(llama-server's --reasoning-budget)")]
StopOpt = Annotated[list[str] | None, typer.Option("--stop", help="Stop string (repeatable)")]
IgnoreEosOpt = Annotated[
    bool, typer.Option("--ignore-eos", help="Generate past end-of-text")]

# loading (the planner's overrides are plan_opts')
RunCtxOpt = Annotated[int, typer.Option("--ctx", min=0, help="Context size (0: auto)")]
BatchOpt = Annotated[
    int, typer.Option("--batch", min=0, help="Prefill batch size (0: planned)")]
RunKvPolicyOpt = Annotated[str, typer.Option(
    "--kv-policy", help="KV cache eviction when the context fills: none, streaming, h2o")]


def lora_option(given: tuple[str, ...] | list[str] | None) -> tuple[tuple[str, float], ...]:
    """`--lora FILE[:SCALE]` flags → the engine's adapter set (engine/lora.py); UsageError
    for a missing file."""
    from inferenceos.engine.lora import lora_set, parse_lora_arg

    return lora_set(parse_lora_arg(x) for x in given or ())


@dataclass(frozen=True)
class SamplingOptions:
    """How `run` samples: the flags as given (checked by `params`). No defaults of its
    own for the engine's knobs: those are the flags' (run's signature)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int | None
    max_tokens: int
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    lora: tuple[str, ...] = ()  # --lora FILE[:SCALE], as given

    def params(self) -> SamplingParams:
        """The engine's SamplingParams for these flags; UsageError (from validate) for
        values out of range."""
        from inferenceos.engine.sampling import SamplingParams

        params = SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
            min_p=self.min_p, seed=self.seed, max_tokens=self.max_tokens,
            stop=self.stop, ignore_eos=self.ignore_eos, lora=lora_option(self.lora),
        )
        params.validate()
        return params

    def chat_options(self) -> dict[str, Any]:
        """The options an interactive chat starts with (its /set names); stop strings
        and --ignore-eos are not among them, as before."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "min_p": self.min_p, "seed": self.seed, "max_tokens": self.max_tokens}


@dataclass(frozen=True)
class LoadOptions:
    """How a command asks for a model to be loaded: the planner's overrides, the budget
    caps, the KV eviction policy, the drafter and the projector, as given."""

    ctx: int = 0
    threads: int = 0
    gpu_layers: int | None = None
    backend: str | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    flash_attn: str = "auto"
    policy: str = "balanced"
    kv_quality: str | None = None
    kv_policy: str = "none"
    rpc: list[str] | None = None
    ram: str | None = None
    gpu_memory: list[str] | None = None
    draft: str | None = None
    mmproj: str | None = None

    def request(self, *, reads_attention: bool | None = None, **more: Any) -> LoadRequest:
        """The LoadRequest for these options (plan_opts.load_request; the drafter as
        `draft_choice` gives it). With `reads_attention` given, its flash attention
        choice too (flash_attn_choice: UsageError for --flash-attn on with a policy
        that reads attention). `more`: other LoadRequest fields."""
        if reads_attention is not None:
            more["flash_attn"] = flash_attn_choice(self.flash_attn, reads_attention)
        return load_request(
            ctx=self.ctx, threads=self.threads, gpu_layers=self.gpu_layers,
            backend=self.backend, cache_type_k=self.cache_type_k,
            cache_type_v=self.cache_type_v, policy=self.policy, rpc=self.rpc, ram=self.ram,
            gpu_memory=self.gpu_memory, kv_quality=self.kv_quality,
            draft=draft_choice(self.draft), **more,
        )
