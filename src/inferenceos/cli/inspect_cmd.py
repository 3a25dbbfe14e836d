"""`inferenceos inspect MODEL`: what a GGUF file holds, from its metadata alone."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from inferenceos.cli.console import out, print_json, safe_text
from inferenceos.cli.model_arg import resolve_model
from inferenceos.units import format_bytes, format_count

if TYPE_CHECKING:  # gguf and numpy load only when the command runs: fast --help
    from inferenceos.model.spec import ModelSpec


def inspect(
    model: Annotated[
        str, typer.Argument(help="Path to a .gguf file (default: built-in Gemma)")
    ] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    digest: Annotated[bool, typer.Option("--digest/--no-digest", help="Compute the sha256")] = True,
) -> None:
    """Show a GGUF model's architecture, sizes, quantization and per-layer bytes."""
    from inferenceos.model.digest import file_digest
    from inferenceos.model.spec import load_spec

    spec = load_spec(resolve_model(model))
    sha = file_digest(spec.path) if digest else None
    if as_json:
        print_json({**spec.to_json(), "sha256": sha})
        return
    _print_summary(spec, sha)
    _print_layers(spec)


def _print_summary(spec: ModelSpec, sha: str | None) -> None:
    t = Table(
        title=safe_text(f"{spec.name}  ({spec.path.name})"), show_header=False, title_justify="left"
    )
    t.add_column(style="bold cyan")
    t.add_column()
    rows = [
        ("architecture", safe_text(spec.architecture)),
        ("file type", safe_text(spec.file_type)),
        ("parameters", format_count(spec.parameters)),
        ("file size", format_bytes(spec.size_bytes)),
        ("blocks", str(spec.block_count)),
        ("embedding", str(spec.embedding_length)),
        ("feed-forward", str(spec.feed_forward_length)),
        ("heads / KV heads", f"{spec.head_count} / {spec.head_count_kv}"),
        ("key / value head dim", f"{spec.key_length} / {spec.value_length}"),
        ("train context", str(spec.context_length)),
        ("vocabulary", str(spec.vocab_size)),
    ]
    if spec.sliding_window:
        swa = ", ".join(map(str, spec.swa_layers))
        rows.append(("sliding window", f"{spec.sliding_window} on layers {swa}"))
    if spec.is_moe:
        rows.append(("experts", f"{spec.expert_used_count} of {spec.expert_count} per token"))
    quant = ", ".join(f"{k} {format_bytes(v)}" for k, v in spec.quant_types.items())  # enum names
    rows.append(("tensor types", quant))
    rows.append(("chat template", "yes" if spec.chat_template else "none in file"))
    if sha:
        rows.append(("sha256", sha))
    for k, v in rows:
        t.add_row(k, v)
    out.print(t)


def _print_layers(spec: ModelSpec) -> None:
    t = Table(title="Bytes per layer", title_justify="left")
    for col in ("layer", "attention", "ffn", "experts", "norms", "total", "attn"):
        t.add_column(col, justify="right")
    for layer in spec.layers:
        t.add_row(
            str(layer.index),
            format_bytes(layer.attention_bytes),
            format_bytes(layer.ffn_bytes),
            format_bytes(layer.expert_bytes) if layer.expert_bytes else "-",
            format_bytes(layer.norm_bytes),
            format_bytes(layer.bytes),
            "swa" if layer.is_swa else "full",
        )
    for name, n in spec.non_layer_bytes.items():
        t.add_row(safe_text(name), "", "", "", "", format_bytes(n), "")
    t.add_row("all", "", "", "", "", format_bytes(spec.tensor_bytes), "", style="bold")
    out.print(t)
