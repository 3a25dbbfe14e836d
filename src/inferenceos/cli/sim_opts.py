"""`simulate`'s own options as Annotated aliases (the machine's are simulate_cmd's,
shared with `placement`; --rpc is cluster_opts'). A flag's spelling and help text
live here once (docs/cli.md is the contract)."""

from __future__ import annotations

from typing import Annotated

import typer

SimModelArg = Annotated[
    str, typer.Argument(help="Path to a .gguf file (default: built-in Gemma)")]
PromptTokensOpt = Annotated[int, typer.Option("--prompt-tokens", help="Prompt length")]
OutputTokensOpt = Annotated[int, typer.Option("--output-tokens", help="Tokens to generate")]
SimCtxOpt = Annotated[
    int, typer.Option("--ctx", help="Context size (0: auto, may shrink to fit)")]
CacheTypeOpt = Annotated[
    str, typer.Option("--cache-type", help="KV cache type: f16, q8_0, q4_0")]
SimPolicyOpt = Annotated[str, typer.Option(
    "--policy", help="Objective: latency, throughput, capacity, balanced, adaptive")]
ImageTokensOpt = Annotated[int, typer.Option(
    "--image-tokens", help="Image (media) tokens in the prompt: encoder time and TTFT "
    "with them", min=0)]
SimMmprojOpt = Annotated[str | None, typer.Option(
    "--mmproj", help="Multimodal projector (mmproj GGUF); default: one beside the model; "
    "'none': without")]
SimDraftOpt = Annotated[str | None, typer.Option(
    "--draft", help="Also predict decode with speculative decoding: ngram, self, a draft "
    "model (PATH.gguf or name), or auto (the drafter the plan chose, if any)")]
TaskOpt = Annotated[str | None, typer.Option(
    "--task", help="With --draft: the acceptance prior for 'copy' (the output quotes the "
    "prompt) or 'free' text, instead of what this model's recorded drafted runs measured")]
SimKvCacheRamOpt = Annotated[str | None, typer.Option(
    "--kv-cache-ram", help="As serve's: the KV cache's RAM tier (default: serve's)")]
SimKvCacheDiskOpt = Annotated[str | None, typer.Option(
    "--kv-cache-disk", help="As serve's: the KV cache's disk tier (default: serve's)")]
SimJsonOpt = Annotated[bool, typer.Option(
    "--json", help="Print one JSON object (with the alternatives the planner rejected)")]
