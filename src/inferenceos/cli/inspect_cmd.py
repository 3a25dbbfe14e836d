"""`inferenceos inspect MODEL`: what a GGUF file holds, from its metadata alone.

A multimodal projector (an mmproj GGUF, `general.architecture = "clip"`) is shown as one:
its kind, encoder size, image / patch size, tokens per image and audio support. A text
model with a projector beside it names the projector (and `--json` adds its facts under
`projector`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from inferenceos.cli.console import out, print_json, safe_text
from inferenceos.cli.model_arg import resolve_model
from inferenceos.errors import InferenceOSError
from inferenceos.units import format_bytes, format_count

if TYPE_CHECKING:  # gguf and numpy load only when the command runs: fast --help
    from inferenceos.model.projector import ProjectorFacts
    from inferenceos.model.spec import ModelSpec


def inspect(
    model: Annotated[
        str, typer.Argument(help="Path to a .gguf file (default: built-in Gemma)")
    ] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    digest: Annotated[bool, typer.Option("--digest/--no-digest", help="Compute the sha256")] = True,
) -> None:
    """Show a GGUF model's architecture, sizes, quantization and per-layer bytes (a
    projector's kind, encoder, image and patch size, audio support)."""
    from inferenceos.model.digest import file_digest
    from inferenceos.model.gguf_file import read_gguf
    from inferenceos.model.projector import CLIP_ARCH, load_projector
    from inferenceos.model.spec import load_spec

    path = resolve_model(model)
    if read_gguf(path).metadata.get("general.architecture") == CLIP_ARCH:
        pf = load_projector(path)
        sha = file_digest(pf.path) if digest else None
        if as_json:
            print_json({"architecture": CLIP_ARCH, "projector": pf.to_json(), "sha256": sha})
            return
        _print_projector(pf, sha)
        return
    spec = load_spec(path)
    sha = file_digest(spec.path) if digest else None
    beside = _projector_beside(spec.path)
    if as_json:
        print_json({**spec.to_json(), "sha256": sha,
                    "projector": beside.to_json() if beside is not None else None})
        return
    _print_summary(spec, sha, beside)
    _print_layers(spec)


def _projector_beside(path: Path) -> ProjectorFacts | None:
    """The projector `run` and `serve` would load with this model (beside it), if any."""
    from inferenceos.model.projector import load_projector
    from inferenceos.model.projector_files import find_projector

    found = find_projector(path)
    if found is None:
        return None
    try:
        return load_projector(found)
    except InferenceOSError:
        return None  # named like a projector, lacking what the loader needs: not shown


def _print_projector(pf: ProjectorFacts, sha: str | None) -> None:
    t = Table(
        title=safe_text(f"{pf.name}  ({pf.path.name})"), show_header=False, title_justify="left"
    )
    t.add_column(style="bold cyan")
    t.add_column()
    media = " + ".join(m for m, on in (("vision", pf.has_vision), ("audio", pf.has_audio)) if on)
    rows = [
        ("multimodal projector", safe_text(pf.kind)),
        ("media", media),
        ("file type", safe_text(pf.file_type)),
        ("parameters", format_count(pf.parameters)),
        ("weights", format_bytes(pf.weight_bytes)),
        ("file size", format_bytes(pf.size_bytes)),
    ]
    for enc in (pf.vision, pf.audio):
        if enc is None:
            continue
        run = f", {enc.layers_run} run" if enc.layers_run != enc.block_count else ""
        rows.append((
            f"{enc.modality} encoder",
            f"{enc.block_count} blocks{run} · width {enc.embedding_length} · ffn "
            f"{enc.feed_forward_length} · {enc.head_count} heads · "
            f"{format_bytes(enc.layer_bytes)}",
        ))
    if pf.has_vision:
        size = f"{pf.image_size} px" if pf.image_size else "dynamic"
        merge = f" · {pf.n_merge}x{pf.n_merge} merge" if pf.n_merge > 1 else ""
        rows.append(("image / patch size", f"{size} / {pf.patch_size} px{merge}"))
        exact = "" if pf.image_tokens_exact else " (approximate: depends on the image)"
        rows.append(("tokens per image", f"{pf.tokens_per_image}{exact}"))
    rows.append(("audio", f"yes, {pf.n_mel_bins} mel bins"
                 + (f", {pf.audio_sample_rate} Hz" if pf.audio_sample_rate else "")
                 if pf.has_audio else "no"))
    rows.append(("adapter", format_bytes(pf.projector_bytes)))
    rows.append(("output embedding", str(pf.output_embedding or "unknown")))
    if sha:
        rows.append(("sha256", sha))
    for k, v in rows:
        t.add_row(k, v)
    out.print(t)


def _print_summary(spec: ModelSpec, sha: str | None, beside: ProjectorFacts | None) -> None:
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
    if beside is not None:
        rows.append(("projector", safe_text(f"{beside.path.name} ({beside.kind})")))
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
