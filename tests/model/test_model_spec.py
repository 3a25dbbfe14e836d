"""ModelSpec from GGUF metadata: tiny fixtures of each shape, and the real Gemma."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferenceos.model.spec import load_spec
from tiny_models import SHAPES

F32 = 4


def test_dense_llama_dimensions(tiny_llama: Path) -> None:
    s = load_spec(tiny_llama)
    shape = SHAPES["llama"]
    assert (s.architecture, s.block_count, s.embedding_length) == ("llama", 2, 64)
    assert (s.head_count, s.head_count_kv, s.key_length, s.value_length) == (4, 2, 16, 16)
    assert s.expert_count == 0 and not s.is_moe
    assert s.swa_layers == ()
    assert s.vocab_size == 287
    assert s.context_length == shape.n_ctx
    assert s.chat_template and "<|im_start|>" in s.chat_template


def test_layer_bytes_split_by_role(tiny_llama: Path) -> None:
    s = load_spec(tiny_llama)
    e, ff, kv = 64, 128, 2 * 16
    layer = s.layers[0]
    assert layer.attention_bytes == (e * e + 2 * kv * e + e * e) * F32
    assert layer.ffn_bytes == 3 * e * ff * F32
    assert layer.norm_bytes == 2 * e * F32
    assert layer.expert_bytes == 0


def test_bytes_add_up_to_tensor_data(tiny_llama: Path, tiny_moe: Path, tiny_swa: Path) -> None:
    for path in (tiny_llama, tiny_moe, tiny_swa):
        s = load_spec(path)
        total = sum(layer.bytes for layer in s.layers) + sum(s.non_layer_bytes.values())
        assert total == s.tensor_bytes
        # the data section holds the tensors plus < alignment bytes of padding each
        assert 0 <= s.tensor_data_size - s.tensor_bytes < 32 * (len(s.layers) * 16 + 8)


def test_moe_experts_counted_apart_from_dense_ffn(tiny_moe: Path) -> None:
    s = load_spec(tiny_moe)
    assert (s.expert_count, s.expert_used_count) == (4, 2)
    assert s.is_moe
    for layer in s.layers:
        assert layer.expert_bytes == 3 * 4 * 128 * 64 * F32
        assert layer.ffn_bytes == 4 * 64 * F32  # only the router (ffn_gate_inp)


def test_swa_pattern_from_metadata(tiny_swa: Path) -> None:
    s = load_spec(tiny_swa)
    assert s.architecture == "gemma3"
    assert s.sliding_window == 32
    assert s.swa_layers == (0, 2)  # pattern 2: every second layer is full attention


def test_parameter_count(tiny_llama: Path) -> None:
    s = load_spec(tiny_llama)
    assert s.parameters * F32 == s.tensor_bytes  # all tensors are f32


@pytest.mark.slow
def test_gemma_spec(gemma_path: Path) -> None:
    s = load_spec(gemma_path)
    assert (s.architecture, s.block_count, s.embedding_length) == ("gemma3", 18, 640)
    assert (s.head_count, s.head_count_kv, s.key_length) == (4, 1, 256)
    assert s.vocab_size == 262144
    assert s.sliding_window == 512
    # llama.cpp's gemma3 default pattern: every 6th layer is global attention
    assert [i for i in range(18) if i not in s.swa_layers] == [5, 11, 17]
    total = sum(layer.bytes for layer in s.layers) + sum(s.non_layer_bytes.values())
    assert total == s.tensor_data_size == gemma_path.stat().st_size - 6525120
    assert set(s.non_layer_bytes) == {"token_embd", "output_norm"}  # tied output
    assert s.file_type == "Q4_K_M"
