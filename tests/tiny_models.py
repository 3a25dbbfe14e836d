"""Tiny GGUF models written with `gguf.GGUFWriter` that llama.cpp really loads and runs.

Three shapes, all with an SPM vocabulary of `<unk> <s> </s>`, the 256 `<0xNN>` byte
tokens and a few letters:
- `llama`: a dense 2-layer llama with grouped-query attention;
- `moe`: the same with 4 routed experts per layer (`ffn_*_exps`), 2 used per token;
- `swa`: a 4-layer gemma3 with a sliding window on layers 0 and 2 (pattern 2).

Weights are seeded random numbers, so the text they produce is gibberish but
deterministic for a given seed and greedy sampling.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LETTERS = "abcdefghijklmnopqrstuvwxyz ."


@dataclass(frozen=True)
class TinyShape:
    """Dimensions of a tiny model (small enough to run in milliseconds)."""

    arch: str = "llama"
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx: int = 512
    n_expert: int = 0
    n_expert_used: int = 0
    sliding_window: int = 0
    swa_pattern: int = 0


SHAPES = {
    "llama": TinyShape(),
    "moe": TinyShape(n_expert=4, n_expert_used=2),
    "swa": TinyShape(arch="gemma3", n_layer=4, sliding_window=32, swa_pattern=2),
    # rotate-half rope and q/k/v biases (tests/upcycle_moe.py's source architecture)
    "qwen2": TinyShape(arch="qwen2"),
    # enough layers (of ~1 MiB) to split over several devices (tests/test_cluster*.py)
    "deep": TinyShape(n_layer=6, n_embd=128, n_head=4, n_head_kv=2, n_ff=512),
    # twice as deep (12.1 MB): a disk-bound plan's streaming room (two layers and the
    # decode's code pages, plan/footprint.stream_room) is then less than what one worker
    # holds, so a RAM cap can need both workers and still run with one (tests/cluster/)
    "deeper": TinyShape(n_layer=12, n_embd=128, n_head=4, n_head_kv=2, n_ff=512),
    # slow enough (~25 MB, a few hundred tokens/s) that a stream outlives a worker load,
    # trained on 4096 tokens (tests/registry/test_pressure.py: migration mid-stream)
    "wide": TinyShape(n_layer=6, n_embd=256, n_head=8, n_head_kv=4, n_ff=1024, n_ctx=4096),
}


def _vocab() -> tuple[list[bytes], list[float], list[int]]:
    tokens = [b"<unk>", b"<s>", b"</s>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{i:02X}>".encode() for i in range(256)]
    types += [TokenType.BYTE] * 256
    for ch in LETTERS:
        tokens.append(("▁" if ch == " " else ch).encode())
        types.append(TokenType.NORMAL)
    scores = [0.0] * 3 + [-1000.0] * 256 + [-float(i) for i in range(len(LETTERS))]
    return tokens, scores, [int(t) for t in types]


def _add_metadata(w: GGUFWriter, s: TinyShape, n_vocab: int, chat_template: str | None) -> None:
    a = s.arch
    w.add_name(f"tiny-{a}{'-moe' if s.n_expert else ''}")
    w.add_uint32(f"{a}.context_length", s.n_ctx)
    w.add_uint32(f"{a}.embedding_length", s.n_embd)
    w.add_uint32(f"{a}.block_count", s.n_layer)
    w.add_uint32(f"{a}.feed_forward_length", s.n_ff)
    w.add_uint32(f"{a}.attention.head_count", s.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", s.n_head_kv)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32(f"{a}.rope.freq_base", 10000.0)
    w.add_uint32(f"{a}.rope.dimension_count", s.n_embd // s.n_head)
    w.add_uint32("general.file_type", 0)  # ALL_F32
    if s.n_expert:
        w.add_uint32(f"{a}.expert_count", s.n_expert)
        w.add_uint32(f"{a}.expert_used_count", s.n_expert_used)
    if s.sliding_window:
        w.add_uint32(f"{a}.attention.sliding_window", s.sliding_window)
        w.add_uint32(f"{a}.attention.sliding_window_pattern", s.swa_pattern)
    tokens, scores, types = _vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    if chat_template:
        w.add_chat_template(chat_template)
    assert len(tokens) == n_vocab


def _add_layer(w: GGUFWriter, s: TinyShape, i: int, rng: np.random.Generator) -> None:
    def t(name: str, *shape: int) -> None:
        w.add_tensor(
            f"blk.{i}.{name}.weight", (rng.standard_normal(shape) * 0.1).astype(np.float32)
        )

    def norm(name: str, n: int) -> None:
        w.add_tensor(f"blk.{i}.{name}.weight", np.ones(n, dtype=np.float32))

    head_dim = s.n_embd // s.n_head
    # numpy shapes are ggml shapes reversed: attn_q is ne {n_embd, n_head*head_dim}
    norm("attn_norm", s.n_embd)
    t("attn_q", s.n_head * head_dim, s.n_embd)
    t("attn_k", s.n_head_kv * head_dim, s.n_embd)
    t("attn_v", s.n_head_kv * head_dim, s.n_embd)
    t("attn_output", s.n_embd, s.n_head * head_dim)
    norm("ffn_norm", s.n_embd)
    if s.arch == "qwen2":
        for name, n in (("attn_q", s.n_head), ("attn_k", s.n_head_kv), ("attn_v", s.n_head_kv)):
            w.add_tensor(f"blk.{i}.{name}.bias",
                         (rng.standard_normal(n * head_dim) * 0.1).astype(np.float32))
    if s.arch == "gemma3":
        norm("attn_q_norm", head_dim)
        norm("attn_k_norm", head_dim)
        norm("post_attention_norm", s.n_embd)
        norm("post_ffw_norm", s.n_embd)
    if s.n_expert:
        t("ffn_gate_inp", s.n_expert, s.n_embd)
        t("ffn_gate_exps", s.n_expert, s.n_ff, s.n_embd)
        t("ffn_up_exps", s.n_expert, s.n_ff, s.n_embd)
        t("ffn_down_exps", s.n_expert, s.n_embd, s.n_ff)
    else:
        t("ffn_gate", s.n_ff, s.n_embd)
        t("ffn_up", s.n_ff, s.n_embd)
        t("ffn_down", s.n_embd, s.n_ff)


def write_tiny_model(
    path: Path, kind: str = "llama", seed: int = 0, chat_template: str | None = CHATML_TEMPLATE,
    letters_only: bool = False,
) -> Path:
    """Write a tiny model of `kind` (a key of SHAPES) to `path` and return it.

    `letters_only`: the output rows of every token but the letters are zero, so greedy
    decoding writes readable letters (a logit of 0 loses to the best of 28 random ones)
    and never ends on its own (for tests that read the text on a screen)."""
    s = SHAPES[kind]
    rng = np.random.default_rng(seed)
    n_vocab = 3 + 256 + len(LETTERS)
    w = GGUFWriter(str(path), s.arch)
    _add_metadata(w, s, n_vocab, chat_template)
    w.add_tensor(
        "token_embd.weight", (rng.standard_normal((n_vocab, s.n_embd)) * 0.1).astype(np.float32)
    )
    for i in range(s.n_layer):
        _add_layer(w, s, i, rng)
    w.add_tensor("output_norm.weight", np.ones(s.n_embd, dtype=np.float32))
    output = (rng.standard_normal((n_vocab, s.n_embd)) * 0.1).astype(np.float32)
    if letters_only:
        output[: n_vocab - len(LETTERS)] = 0.0
    w.add_tensor("output.weight", output)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
