"""Tiny reranker GGUFs that llama.cpp loads with rank pooling, and their scores in numpy.

Two styles, both with `pooling_type` 4 (rank) and the SPM vocabulary of
tests/tiny_models.py, their weights built, not drawn, so the score has a closed form
and documents are ordered for a reason:

- `qwen3` (a Qwen3 reranker's shape: llama.cpp reads its head from `cls.output`, one
  row per `classifier.output_labels` entry, and softmaxes it; rank pooling in a causal
  model reads the last token). One layer: attention queries and keys are zero, so each
  position attends uniformly to all before it, values and output are the identity;
  the feed-forward block is zero. The last position's state is its own embedding plus
  the mean of every position's RMS-normalised embedding, and the "yes" row weighs the
  letters of `RELEVANT` +1/4 and the others -1/4 (the "no" row is zero).
  `rerank_template`: a `tokenizer.chat_template.rerank` (`{query}`, `{document}`), as
  Qwen3 rerankers ship; without one llama.cpp formats `[BOS] query [EOS] document
  [EOS]` (`add_eos` is set so that path has something to add).
- `bert` (BGE's shape: bidirectional, position and token-type embeddings, layer norms,
  the `cls` dense + tanh then `cls.output`; rank pooling reads the first token). The
  same zero queries and keys (every position attends to all), identity values, a zero
  feed-forward block, an identity `cls` and the same letter weights in `cls.output`;
  formatted `[BOS] query [EOS] document [EOS]`.

Each letter's embedding is a one-hot on a dimension of its own (bytes share the last
eight, BOS and EOS have theirs), so in both a document scores higher the larger its
share of `RELEVANT` letters; `expected_score` computes the score llama.cpp gives.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, PoolingType

from tiny_models import LETTERS, _vocab

N_EMBD = 64
RELEVANT = "aeiou"  # the letters the head rewards
EPS = 1e-6
TEMPLATE = "<s>query {query} document {document}</s>"


def _embeddings(n_vocab: int) -> np.ndarray:
    emb = np.zeros((n_vocab, N_EMBD), dtype=np.float32)
    emb[1, 0] = 1.0  # <s>
    emb[2, 1] = 1.0  # </s>
    for b in range(256):  # byte tokens: the last 8 dimensions
        emb[3 + b, N_EMBD - 8 + b % 8] = 1.0
    for i in range(len(LETTERS)):
        emb[3 + 256 + i, 2 + i] = 1.0
    return emb


def _head() -> np.ndarray:
    head = np.zeros((2, N_EMBD), dtype=np.float32)
    for i, ch in enumerate(LETTERS):
        head[0, 2 + i] = 0.25 if ch in RELEVANT else -0.25
    return head


def _tokenizer(w: GGUFWriter, add_eos: bool) -> int:
    tokens, scores, types = _vocab()
    w.add_pooling_type(PoolingType.RANK)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(add_eos)
    w.add_uint32("general.file_type", 0)
    return len(tokens)


def _write_bert(path: Path) -> Path:
    a = "bert"
    w = GGUFWriter(str(path), a)
    w.add_name("tiny-bert-reranker")
    for key, value in (("context_length", 512), ("embedding_length", N_EMBD),
                       ("block_count", 1), ("feed_forward_length", N_EMBD),
                       ("attention.head_count", 4)):
        w.add_uint32(f"{a}.{key}", value)
    w.add_float32(f"{a}.attention.layer_norm_epsilon", EPS)
    w.add_bool(f"{a}.attention.causal", False)
    w.add_uint32("tokenizer.ggml.token_type_count", 2)
    n_vocab = _tokenizer(w, add_eos=True)
    ones, zero = np.ones(N_EMBD, dtype=np.float32), np.zeros(N_EMBD, dtype=np.float32)
    eye = np.eye(N_EMBD, dtype=np.float32)
    zeros = np.zeros((N_EMBD, N_EMBD), dtype=np.float32)
    w.add_tensor("token_embd.weight", _embeddings(n_vocab))
    w.add_tensor("token_types.weight", np.zeros((2, N_EMBD), dtype=np.float32))
    w.add_tensor("position_embd.weight", np.zeros((512, N_EMBD), dtype=np.float32))
    w.add_tensor("token_embd_norm.weight", ones)
    w.add_tensor("token_embd_norm.bias", zero)
    for name, tensor in (("attn_q", zeros), ("attn_k", zeros), ("attn_v", eye),
                         ("attn_output", eye), ("ffn_up", zeros), ("ffn_down", zeros)):
        w.add_tensor(f"blk.0.{name}.weight", tensor)
    for name in ("attn_output_norm", "layer_output_norm"):
        w.add_tensor(f"blk.0.{name}.weight", ones)
        w.add_tensor(f"blk.0.{name}.bias", zero)
    w.add_tensor("cls.weight", eye)
    w.add_tensor("cls.bias", zero)
    w.add_tensor("cls.output.weight", _head()[:1])
    w.add_tensor("cls.output.bias", np.zeros(1, dtype=np.float32))
    return _finish(w, path)


def _finish(w: GGUFWriter, path: Path) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_tiny_reranker(path: Path, rerank_template: bool = True, arch: str = "qwen3"
                        ) -> Path:
    """Write the reranker of `arch` ("qwen3" or "bert"; module contract) to `path`."""
    if arch == "bert":
        return _write_bert(path)
    a = "qwen3"
    w = GGUFWriter(str(path), a)
    w.add_name("tiny-reranker")
    for key, value in (("context_length", 512), ("embedding_length", N_EMBD),
                       ("block_count", 1), ("feed_forward_length", N_EMBD),
                       ("attention.head_count", 4), ("attention.head_count_kv", 4),
                       ("rope.dimension_count", N_EMBD // 4)):
        w.add_uint32(f"{a}.{key}", value)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", EPS)
    w.add_float32(f"{a}.rope.freq_base", 10000.0)
    w.add_classifier_output_labels(["yes", "no"])
    n_vocab = _tokenizer(w, add_eos=not rerank_template)
    if rerank_template:
        w.add_string("tokenizer.chat_template.rerank", TEMPLATE)
    zeros = np.zeros((N_EMBD, N_EMBD), dtype=np.float32)
    eye = np.eye(N_EMBD, dtype=np.float32)
    w.add_tensor("token_embd.weight", _embeddings(n_vocab))
    for name, tensor in (("attn_norm", np.ones(N_EMBD)), ("attn_q", zeros), ("attn_k", zeros),
                         ("attn_v", eye), ("attn_output", eye),
                         ("attn_q_norm", np.ones(N_EMBD // 4)),
                         ("attn_k_norm", np.ones(N_EMBD // 4)), ("ffn_norm", np.ones(N_EMBD)),
                         ("ffn_gate", zeros), ("ffn_up", zeros), ("ffn_down", zeros)):
        w.add_tensor(f"blk.0.{name}.weight", np.asarray(tensor, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor("output.weight", _embeddings(n_vocab))
    w.add_tensor("cls.output.weight", _head())
    return _finish(w, path)


def _rms_norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS)


def _layer_norm(x: np.ndarray) -> np.ndarray:
    c = x - x.mean(axis=-1, keepdims=True)
    return c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + EPS)


def expected_score(tokens: list[int], arch: str = "qwen3") -> float:
    """The score llama.cpp computes for the token sequence `tokens` (module contract)."""
    x = _embeddings(len(_vocab()[0]))[tokens].astype(np.float64)
    if arch == "bert":
        u = _layer_norm(x)
        h = _layer_norm(_layer_norm(u[0] + u.mean(axis=0)))  # attention, then a zero FFN
        return float(_head()[0] @ np.tanh(h))
    logits = _head() @ _rms_norm(x[-1] + _rms_norm(x).mean(axis=0))
    p = np.exp(logits - logits.max())
    return float(p[0] / p.sum())
