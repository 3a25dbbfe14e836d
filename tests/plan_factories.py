"""Factories for planner tests: synthetic models and machines of any size, instantly.

`dense_facts()` / `moe_facts()` build ModelFacts directly (no file), with Q4_0 weights;
`write_sparse_gguf()` writes a real GGUF header whose tensor data is a sparse hole, so a
"30 GB" model costs a few KB of disk and reads like the real thing.
"""

from __future__ import annotations

from pathlib import Path

from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

from gguf_craft import build, kv_scalar, kv_str, kv_u32, tensor_info
from inferenceos.model.spec import LayerSpec, ModelSpec
from inferenceos.plan.devices import Device, Machine
from inferenceos.plan.model_facts import ModelFacts, TensorFact

GiB = 1024**3
Q4_0_BYTES = 18 / 32


def _tensor(name: str, layer: int, role: str, shape: tuple[int, ...]) -> TensorFact:
    n = 1
    for d in shape:
        n *= d
    return TensorFact(
        name,
        layer,
        role,
        "q4_0",
        shape[1] if len(shape) > 1 else 1,
        len(shape),
        int(n * Q4_0_BYTES),
        n,
    )


def make_facts(
    n_layer: int = 32,
    n_embd: int = 4096,
    n_ff: int = 14336,
    n_head: int = 32,
    n_head_kv: int = 8,
    n_vocab: int = 32000,
    n_expert: int = 0,
    n_used: int = 0,
    n_ctx_train: int = 32768,
    name: str = "synthetic",
) -> ModelFacts:
    """A llama-shaped model (MoE when n_expert > 0), all weights Q4_0."""
    d = n_embd // n_head
    # ggml shapes (ne0 = inputs, ne1 = output rows): gate and up n_embd -> n_ff, down back
    ffn = (("gate", (n_embd, n_ff)), ("up", (n_embd, n_ff)), ("down", (n_ff, n_embd)))
    tensors = [_tensor("token_embd.weight", -1, "token_embd", (n_embd, n_vocab))]
    for i in range(n_layer):
        tensors += [
            _tensor(f"blk.{i}.attn_q.weight", i, "attention", (n_embd, n_embd)),
            _tensor(f"blk.{i}.attn_k.weight", i, "attention", (n_embd, n_head_kv * d)),
            _tensor(f"blk.{i}.attn_v.weight", i, "attention", (n_embd, n_head_kv * d)),
            _tensor(f"blk.{i}.attn_output.weight", i, "attention", (n_embd, n_embd)),
        ]
        if n_expert:
            tensors += [
                _tensor(f"blk.{i}.ffn_gate_inp.weight", i, "ffn", (n_embd, n_expert)),
                *(
                    _tensor(f"blk.{i}.ffn_{k}_exps.weight", i, "expert", (*shape, n_expert))
                    for k, shape in ffn
                ),
            ]
        else:
            tensors += [_tensor(f"blk.{i}.ffn_{k}.weight", i, "ffn", shape) for k, shape in ffn]
    tensors.append(_tensor("output.weight", -1, "output", (n_embd, n_vocab)))
    layers = tuple(
        LayerSpec(
            index=i,
            attention_bytes=sum(
                t.n_bytes for t in tensors if t.layer == i and t.role == "attention"
            ),
            ffn_bytes=sum(t.n_bytes for t in tensors if t.layer == i and t.role == "ffn"),
            expert_bytes=sum(t.n_bytes for t in tensors if t.layer == i and t.role == "expert"),
            head_count_kv=n_head_kv,
        )
        for i in range(n_layer)
    )
    total = sum(t.n_bytes for t in tensors)
    spec = ModelSpec(
        path=Path(f"/models/{name}.gguf"),
        name=name,
        architecture="llama",
        file_type="Q4_0",
        block_count=n_layer,
        embedding_length=n_embd,
        feed_forward_length=n_ff,
        head_count=n_head,
        head_count_kv=n_head_kv,
        key_length=d,
        value_length=d,
        context_length=n_ctx_train,
        sliding_window=0,
        expert_count=n_expert,
        expert_used_count=n_used,
        vocab_size=n_vocab,
        parameters=sum(t.n_elements for t in tensors),
        size_bytes=total,
        tensor_bytes=total,
        tensor_data_size=total,
        non_layer_bytes={"token_embd": tensors[0].n_bytes, "output": tensors[-1].n_bytes},
        layers=layers,
        quant_types={"Q4_0": total},
    )
    return ModelFacts(spec=spec, tensors=tuple(tensors))


def q4_k_m_like(facts: ModelFacts, layers: set[int] | None = None) -> ModelFacts:
    """`facts` with the ffn_down (of a MoE: ffn_down_exps) of some layers at Q6_K's
    bytes (1.46x Q4_0's), as llama.cpp's Q4_K_M makes them (its use_more_bits: the
    first and last eighth and every third layer between): layers no longer alike, as
    in a real Q4_K_M file. `layers`: which ones (default: Q4_K_M's)."""
    from dataclasses import replace

    n = facts.spec.block_count
    if layers is None:
        layers = {i for i in range(n)
                  if i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2}
    name = "ffn_down_exps.weight" if facts.spec.expert_count else "ffn_down.weight"
    tensors = tuple(
        replace(t, n_bytes=round(t.n_bytes * 1.46))
        if t.layer in layers and t.name.endswith(name) else t
        for t in facts.tensors)
    return replace(facts, tensors=tensors)


def moe_facts() -> ModelFacts:
    """Mixtral-8x7B-shaped, ~25 GiB at Q4_0."""
    return make_facts(n_expert=8, n_used=2, name="synthetic-moe")


def machine(ram: float = 32 * GiB, gpus: tuple[float, ...] = (), threads: int = 8) -> Machine:
    cpu = Device("CPU", "cpu", int(ram), 50.0, threads=threads, isa=("avx2",), llama_name="CPU")
    accs = tuple(
        Device(f"GPU{i}", "gpu", int(m), 300.0, tflops=20.0, link_gbps=12.0, llama_name=f"GPU{i}")
        for i, m in enumerate(gpus)
    )
    return Machine(devices=(cpu, *accs), disk_gbps=2.0, source="test")


def write_sparse_gguf(path: Path, facts: ModelFacts) -> Path:
    """A GGUF file with `facts`' metadata and tensor table; the data is a sparse hole."""
    s = facts.spec
    kvs = [
        kv_str("general.architecture", "llama"),
        kv_str("general.name", s.name),
        kv_u32("llama.block_count", s.block_count),
        kv_u32("llama.embedding_length", s.embedding_length),
        kv_u32("llama.feed_forward_length", s.feed_forward_length),
        kv_u32("llama.attention.head_count", s.head_count),
        kv_u32("llama.attention.head_count_kv", s.head_count_kv),
        kv_u32("llama.context_length", s.context_length),
        kv_scalar("llama.rope.freq_base", VT.FLOAT32, 10000.0),
    ]
    if s.expert_count:
        kvs += [
            kv_u32("llama.expert_count", s.expert_count),
            kv_u32("llama.expert_used_count", s.expert_used_count),
        ]
    infos, offset = [], 0
    for t in facts.tensors:
        shape = _shape(t, s.expert_count)
        infos.append(tensor_info(t.name, shape, QT.Q4_0, offset))
        offset += t.n_bytes + (-t.n_bytes % 32)
    head = build(kvs, infos)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + offset)
    return path


def _shape(t: TensorFact, n_expert: int) -> list[int]:
    per_row = t.n_elements // t.rows
    if t.n_dims == 3:
        return [per_row // n_expert, t.rows, n_expert]
    return [per_row, t.rows]
