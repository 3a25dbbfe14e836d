"""A mixture-of-experts model whose routing means something, built from a real dense one.

Sparse upcycling (issue 30's test model for experts paged by heat): every layer of
Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, the `chat` extra's model) keeps its attention and
norms; its feed-forward network becomes `--experts` copies of itself, each with small
perturbations, behind a router over the hidden state that picks `--used` of them per
token. The text stays coherent (each expert is nearly the dense FFN and the picked
experts' weights are normalised to sum to 1) and the routing depends on the tokens
(the router is a fixed random projection of the hidden state). With `--skew` the
routers also lean towards the low experts (skew_router), so some experts are hot and
some cold, as in trained MoEs: what a resident set chosen by heat can use.

How, in llama.cpp's terms: the file is written as a Mixtral-style `llama` model
(`llama.expert_count`, `ffn_gate_inp`, `ffn_{gate,up,down}_exps`; llama.cpp's
`build_moe_ffn` with softmax gating and normalised top-k weights). Qwen2 is not
`llama`: its q/k rows are in the rotate-half (NEOX) order and llama ropes adjacent
pairs, so the q and k rows (weights and biases) are permuted as llama.cpp's own
converter permutes Llama checkpoints; the q/k/v biases are ones llama loads when
present. Quantized weights are copied as raw bytes (a row is whole blocks, so rows
permute as byte rows); an expert's perturbation scales each block's fp16 scale (and
min) by 1 + N(0, `--noise`), which scales that block's weights.

    .venv/bin/python tests/upcycle_moe.py [--experts 4] [--used 2] [--noise 0.05]
        [--seed 0] [--skew 1.5] [--out FILE]
    # default out: <cache>/models/qwen2.5-coder-0.5b-moe4.gguf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

# fp16 scale fields inside one block: Q5_0/Q8_0 d, Q4_K d and dmin, Q6_K d (at the end)
SCALE_OFFSETS = {"Q4_0": (0,), "Q5_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2),
                 "Q6_K": (208,)}
RENAMED = ("context_length", "embedding_length", "block_count", "feed_forward_length",
           "attention.head_count", "attention.head_count_kv", "rope.freq_base",
           "attention.layer_norm_rms_epsilon")
FFN = ("ffn_gate", "ffn_up", "ffn_down")
ROPE_ORDER = {"llama": False, "qwen2": True}  # source architecture -> rotate-half (NEOX) rows


def permute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Rotate-half (NEOX) row order -> adjacent pairs, per head (llama.cpp's
    convert_hf_to_gguf `LlamaModel.permute`), for weight rows or a bias vector."""
    shape = rows.shape
    return (rows.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:])
            .swapaxes(1, 2).reshape(shape))


def perturbed(data: np.ndarray, qtype: str, noise: float, rng: np.random.Generator
              ) -> np.ndarray:
    """A copy of raw quantized rows with each block's scale fields times 1 + N(0, noise)
    (float rows: each row times its own factor)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if qtype in ("F32", "F16"):
        factor = 1.0 + rng.normal(0.0, noise, (data.shape[0], 1))
        return (data * factor).astype(data.dtype)
    _, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    out = np.array(data, copy=True)
    blocks = out.reshape(out.shape[0], -1, block_bytes)
    factor = (1.0 + rng.normal(0.0, noise, blocks.shape[:2])).astype(np.float32)
    for off in SCALE_OFFSETS[qtype]:
        field = blocks[:, :, off:off + 2].copy().view(np.float16)[..., 0]
        scaled = (field.astype(np.float32) * factor).astype(np.float16)
        blocks[:, :, off:off + 2] = scaled[..., None].view(np.uint8)
    return out


def _copy_metadata(reader: Any, writer: Any, experts: int, used: int) -> None:
    """The dense model's hyper-parameters under `llama.*`, its tokenizer as is."""
    from gguf import GGUFValueType

    arch = reader.fields["general.architecture"].contents()
    for key in RENAMED:
        f = reader.fields.get(f"{arch}.{key}")
        if f is not None:
            writer.add_key_value(f"llama.{key}", f.contents(), f.types[0])
    heads = reader.fields[f"{arch}.attention.head_count"].contents()
    width = reader.fields[f"{arch}.embedding_length"].contents()
    writer.add_uint32("llama.rope.dimension_count", width // heads)
    writer.add_uint32("llama.expert_count", experts)
    writer.add_uint32("llama.expert_used_count", used)
    writer.add_name(f"{reader.fields['general.name'].contents()} upcycled MoE {experts}x")
    for key, f in reader.fields.items():
        if key.startswith("tokenizer.") or key in ("general.file_type",
                                                    "general.quantization_version"):
            sub = f.types[1] if f.types[0] == GGUFValueType.ARRAY else None
            writer.add_key_value(key, f.contents(), f.types[0], sub_type=sub)


def _add(writer: Any, name: str, t: Any, data: np.ndarray) -> None:
    """A tensor with `t`'s type: raw bytes for quantized types, values for floats."""
    from gguf import GGMLQuantizationType

    if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        writer.add_tensor(name, np.ascontiguousarray(data))
    else:
        writer.add_tensor(name, np.ascontiguousarray(data), raw_dtype=t.tensor_type)


def _add_layer_tensor(writer: Any, t: Any, heads: int, kv_heads: int, neox: bool) -> None:
    """A non-FFN tensor, with q/k rows in llama's rope order."""
    part = t.name.split(".")[2]
    data = np.asarray(t.data)
    if neox and part == "attn_q":
        data = permute_rows(data, heads)
    elif neox and part == "attn_k":
        data = permute_rows(data, kv_heads)
    _add(writer, t.name, t, data)


def _add_experts(writer: Any, layer: int, ffn: dict[str, Any], experts: int, noise: float,
                 rng: np.random.Generator) -> None:
    """The layer's FFN as `experts` perturbed copies, and the router over them."""
    for part in FFN:
        t = ffn[part]
        qtype = t.tensor_type.name
        copies = [perturbed(np.asarray(t.data), qtype, noise, rng) for _ in range(experts)]
        _add(writer, f"blk.{layer}.{part}_exps.weight", t, np.stack(copies))
    width = int(ffn["ffn_up"].shape[0])  # ggml order: [n_embd, n_ff]
    # logits ~ N(0, 1) per expert for a hidden state of unit RMS: routing follows the token
    router = rng.normal(0.0, 1.0 / np.sqrt(width), (experts, width)).astype(np.float32)
    writer.add_tensor(f"blk.{layer}.ffn_gate_inp.weight", router)


def upcycle(src: Path, dst: Path, experts: int = 4, used: int = 2, noise: float = 0.05,
            seed: int = 0, skew: float = 0.0) -> Path:
    """Write the upcycled MoE of the dense GGUF `src` to `dst` (atomically), its routers
    leaning by `skew` (skew_router; 0: none); returns it."""
    from gguf import GGUFReader, GGUFWriter

    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    if arch not in ROPE_ORDER:
        raise ValueError(f"upcycling {arch} models is not supported (only {sorted(ROPE_ORDER)})")
    heads = reader.fields[f"{arch}.attention.head_count"].contents()
    kv_heads = reader.fields[f"{arch}.attention.head_count_kv"].contents()
    tmp = dst.with_suffix(".tmp")
    writer = GGUFWriter(str(tmp), "llama")
    _copy_metadata(reader, writer, experts, used)
    rng = np.random.default_rng(seed)
    ffn: dict[int, dict[str, Any]] = {}
    for t in reader.tensors:
        parts = t.name.split(".")
        if parts[0] != "blk":
            _add(writer, t.name, t, np.asarray(t.data))
        elif parts[2] in FFN:
            ffn.setdefault(int(parts[1]), {})[parts[2]] = t
            if len(ffn[int(parts[1])]) == len(FFN):
                _add_experts(writer, int(parts[1]), ffn.pop(int(parts[1])), experts, noise,
                             rng)
        else:
            _add_layer_tensor(writer, t, heads, kv_heads, ROPE_ORDER[arch])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if skew:
        mean = np.mean(list(skew_router(tmp, skew).values()), axis=0)
        print("picks per token by expert (probe text): " + " ".join(f"{x:.2f}" for x in mean))
    tmp.replace(dst)
    return dst


# text the router's input is sampled on: prose, code and a list, as a chat model sees
PROBE_TEXT = (
    "The committee met on Tuesday to discuss the budget for next year. Several members "
    "argued that the library needed new windows, while others wanted more books.\n"
    "def merge(a, b):\n    out = []\n    while a and b:\n        out.append(a.pop(0) if "
    "a[0] < b[0] else b.pop(0))\n    return out + a + b\n"
    "Shopping list: eggs, flour, two lemons, olive oil, coffee beans, rice.\n"
    "Q: What is the capital of France? A: Paris. Q: How many legs does a spider have?"
)


class _RouterInputs:
    """cb_eval that keeps each layer's `ffn_norm-i` output: the router's input
    (llama.cpp's llm_build_llama feeds it to build_moe_ffn), [n_embd, n_tokens] f32."""

    def __init__(self) -> None:
        from llama_cpp.llama_cpp import ggml_backend_sched_eval_callback

        from inferenceos.engine.kv.attention_probe import GGMLTensor, _tensor_get

        self._tensor, self._get = GGMLTensor, _tensor_get()
        self.rows: dict[int, list[np.ndarray]] = {}
        self.callback = ggml_backend_sched_eval_callback(self._on_tensor)

    def _on_tensor(self, addr: int, ask: bool, _user: Any) -> bool:
        import ctypes

        ptr = ctypes.cast(addr, ctypes.POINTER(self._tensor))
        t = ptr.contents
        layer = t.name[len(b"ffn_norm-"):]  # not its views ("ffn_norm-0 (reshaped)")
        if not t.name.startswith(b"ffn_norm-") or not layer.isdigit() or t.type != 0:
            return False
        if ask:
            return True
        width, n = int(t.ne[0]), int(t.ne[1])
        data = np.empty(width * n, np.float32)
        self._get(ptr, data.ctypes.data, 0, data.nbytes)
        self.rows.setdefault(int(layer), []).append(data.reshape(n, width))
        return True


def skew_router(path: Path, skew: float, text: str = PROBE_TEXT) -> dict[int, np.ndarray]:
    """Give the routers of the upcycled model at `path` a lean, in place: expert e's row
    loses its component along mu and gains `skew * z_e * sigma / |mu|^2 * mu`, where mu
    is the layer's mean router input over `text` (measured by running the model), sigma
    the spread of its random logits across those tokens and z_e evenly spaced from +1
    to -1. A token's logit for expert e is then its random, token-dependent part plus
    about skew * z_e * sigma (its input's projection on mu is near |mu|^2), so the low
    experts are picked most while the random part still routes by token: a workload with
    hot and cold experts, which a resident set by heat can use (issue 30). Returns each
    layer's share of picks per expert on `text` after the change (numpy top-k)."""
    from gguf import GGUFReader

    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.engine.scheduler import generate_one
    from inferenceos.engine.session import LoadedModel
    from inferenceos.plan.llama_params import LlamaParams

    probe = _RouterInputs()
    with LoadedModel(path, LlamaParams(n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2),
                     eval_callback=probe.callback) as m:
        list(generate_one(m, m.tokenize(text), SamplingParams(temperature=0, max_tokens=1)))
    reader = GGUFReader(path, "r+")
    used = int(reader.fields["llama.expert_used_count"].contents())
    shares: dict[int, np.ndarray] = {}
    for t in reader.tensors:
        if not t.name.endswith("ffn_gate_inp.weight"):
            continue
        layer = int(t.name.split(".")[1])
        if layer not in probe.rows:
            raise RuntimeError(f"no router input seen for layer {layer}: {sorted(probe.rows)}")
        x = np.concatenate(probe.rows[layer])  # [tokens, width]
        router = t.data  # [experts, width], a writable view of the file
        mu = x.mean(axis=0)
        unit = mu / float(mu @ mu)  # x @ unit is 1 on average
        # each row's own lean along mu goes (a random row's happens to favour some
        # experts by a constant, large where the inputs share a large mean) ...
        router -= np.outer(router @ mu, unit).astype(np.float32)
        sigma = float(((x - mu) @ router.T).std())
        # ... and the chosen one comes in: the logits' spread across tokens times z_e
        z = np.linspace(1.0, -1.0, router.shape[0])
        router += np.outer(skew * sigma * z, mu).astype(np.float32) * np.float32(
            1.0 / float(mu @ mu))
        top = np.argsort(-(x @ router.T), axis=1)[:, :used]
        shares[layer] = np.bincount(top.ravel(), minlength=router.shape[0]) / len(x)
    reader.data.flush()
    return shares


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--used", type=int, default=2)
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skew", type=float, default=1.5,
                    help="the routers' lean towards the low experts (0: none)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    from inferenceos.model.packaged_models import ensure_packaged_model
    from inferenceos.paths import cache_dir

    src = Path(ensure_packaged_model("qwen2.5-coder-0.5b-instruct"))
    out = a.out or cache_dir() / "models" / f"qwen2.5-coder-0.5b-moe{a.experts}.gguf"
    upcycle(src, out, a.experts, a.used, a.noise, a.seed, a.skew)
    print(f"{out}: {out.stat().st_size / 2**20:.0f} MiB, {a.experts} experts, {a.used} used")
    return 0


if __name__ == "__main__":
    sys.exit(main())
