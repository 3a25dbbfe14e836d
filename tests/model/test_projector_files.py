"""Where a model's projector comes from: the file beside it (names, headers, widths),
a named file (`--mmproj`), and the Hub's file list (names only)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fake_hub import tiny_projector
from inferenceos.errors import ModelNotFoundError, UsageError
from inferenceos.model.projector_files import (
    belongs_tier,
    check_projector,
    find_projector,
    is_projector,
    projector_info,
    rank_projectors,
    read_projector,
)
from inferenceos.registry.hub_names import Candidate, HubFile, choose_projector


@pytest.fixture
def folder(tmp_path: Path, tiny_llama: Path) -> Path:
    """A folder holding the tiny llama as `gemma-3-4b-it-Q4_K_M.gguf`."""
    d = tmp_path / "models"
    d.mkdir()
    shutil.copyfile(tiny_llama, d / "gemma-3-4b-it-Q4_K_M.gguf")
    return d


def model(folder: Path) -> Path:
    return folder / "gemma-3-4b-it-Q4_K_M.gguf"


@pytest.mark.parametrize("model_name, projector_name, tier", [
    ("gemma-3-4b-it-Q4_K_M.gguf", "gemma-3-4b-it-Q4_K_M.mmproj.gguf", 0),
    ("gemma-3-4b-it-Q4_K_M.gguf", "mmproj-gemma-3-4b-it-Q4_K_M.gguf", 0),
    ("gemma-3-4b-it-Q4_K_M.gguf", "mmproj-gemma-3-4b-it-f16.gguf", 1),
    ("google_gemma-3-4b-it-Q4_K_M.gguf", "mmproj-google_gemma-3-4b-it-bf16.gguf", 1),
    ("Qwen2.5-VL-7B-Instruct-UD-Q4_K_XL.gguf", "mmproj-Qwen2.5-VL-7B-Instruct-f16.gguf", 1),
    ("model-00001-of-00003.gguf", "model.mmproj.gguf", 0),
    ("gemma-3-4b-it-Q4_K_M.gguf", "mmproj.gguf", 2),
    ("gemma-3-4b-it-Q4_K_M.gguf", "mmproj-F16.gguf", 2),
    ("gemma-3-4b-it-Q4_K_M.gguf", "mmproj-model-f16.gguf", 2),
    ("phi-3-mini-Q4_K_M.gguf", "mmproj-qwen2-vl-7b-f16.gguf", None),  # another model's
    ("gemma-3-4b-it-Q4_K_M.gguf", "mmproj-gemma-3-12b-it-f16.gguf", None),
])
def test_which_names_belong_to_a_model(model_name: str, projector_name: str,
                                        tier: int | None) -> None:
    assert belongs_tier(model_name, projector_name) == tier


def test_no_projector_beside_a_text_model(folder: Path) -> None:
    assert find_projector(model(folder)) is None
    (folder / "notes-mmproj.txt").write_text("not a gguf")
    assert find_projector(model(folder)) is None


def test_the_projector_beside_the_model_is_found(folder: Path) -> None:
    p = tiny_projector(folder / "mmproj-gemma-3-4b-it-f16.gguf")
    assert find_projector(model(folder)) == p
    assert is_projector(p) and not is_projector(model(folder))


def test_files_named_mmproj_that_are_not_projectors_are_skipped(folder: Path,
                                                                tiny_llama: Path) -> None:
    shutil.copyfile(tiny_llama, folder / "mmproj-gemma-3-4b-it-f16.gguf")  # a text model
    (folder / "mmproj-gemma-3-4b-it-bf16.gguf").write_bytes(b"GGUF\x03\x00\x00\x00junk")
    (folder / "mmproj-gemma-3-4b-it-f32.gguf").write_bytes(b"")
    (folder / "mmproj-gemma-3-4b-it-q8_0.gguf").mkdir()  # a folder with a projector's name
    assert find_projector(model(folder)) is None
    good = tiny_projector(folder / "mmproj-F32.gguf", weights="f32")
    assert find_projector(model(folder)) == good  # generic, but the only real one


def test_f16_before_bf16_before_f32_before_q8_0_by_header_not_name(folder: Path) -> None:
    # names lie on purpose: the weight type is read from the header
    tiny_projector(folder / "mmproj-a.gguf", weights="q8_0", name="x")
    assert find_projector(model(folder)) is None  # "a" names some other model
    for n, w in (("mmproj-F32.gguf", "f32"), ("mmproj-model-q8.gguf", "q8_0"),
                 ("mmproj.gguf", "bf16")):
        tiny_projector(folder / n, weights=w)
    assert find_projector(model(folder)) == folder / "mmproj.gguf"  # bf16 beats f32, q8_0
    tiny_projector(folder / "mmproj-vision.gguf", weights="f16")
    assert find_projector(model(folder)) == folder / "mmproj-vision.gguf"
    assert read_projector(folder / "mmproj-vision.gguf").weight_type == "F16"


def test_a_projector_naming_the_model_beats_generic_ones(folder: Path) -> None:
    tiny_projector(folder / "mmproj-F16.gguf")
    named = tiny_projector(folder / "mmproj-gemma-3-4b-it-f32.gguf", weights="f32")
    assert find_projector(model(folder)) == named  # the name outranks the precision
    exact = tiny_projector(folder / "gemma-3-4b-it-Q4_K_M.mmproj.gguf", weights="q8_0")
    assert find_projector(model(folder)) == exact


def test_a_projector_of_another_width_is_not_taken(folder: Path) -> None:
    # the tiny llama's embeddings are 64 wide; mtmd refuses a projector that outputs 96
    tiny_projector(folder / "mmproj-gemma-3-4b-it-f16.gguf", n_embd_text=96)
    assert find_projector(model(folder)) is None
    ok = tiny_projector(folder / "mmproj-f32.gguf", weights="f32")
    assert find_projector(model(folder)) == ok


def test_check_projector_says_what_is_wrong(folder: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"projector .*nope\.gguf: no such file"):
        check_projector(folder / "nope.gguf")
    with pytest.raises(UsageError, match=r"not a multimodal projector \(general.architecture "
                                         r"is 'llama', expected 'clip'\)"):
        check_projector(model(folder))
    junk = folder / "junk.gguf"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(UsageError, match=r"junk\.gguf is not a multimodal projector: not a GGUF"):
        check_projector(junk)
    other = tiny_projector(folder / "other.gguf", arch="llava")
    with pytest.raises(UsageError, match="'llava'"):
        check_projector(other)
    good = tiny_projector(folder / "p.gguf")
    assert check_projector(str(good)) == good


def test_projector_info_is_the_metadata_ollama_reports(folder: Path) -> None:
    info = projector_info(tiny_projector(folder / "p.gguf"))
    assert info["general.architecture"] == "clip"
    assert info["clip.has_vision_encoder"] is True and info["clip.projector_type"] == "mlp"
    assert info["clip.vision.image_mean"] == pytest.approx([0.5, 0.5, 0.5])
    audio = read_projector(tiny_projector(folder / "a.gguf", audio=True))
    assert audio.audio and not audio.vision


def test_hub_listing_ranks_by_name() -> None:
    names = ["mmproj-BF16.gguf", "mmproj-F32.gguf", "mmproj-F16.gguf", "mmproj-Q8_0.gguf",
             "mmproj-other-model-f16.gguf", "mmproj.gguf"]
    assert rank_projectors("Gemma-Q4_K_M.gguf", names) == [
        "mmproj-F16.gguf", "mmproj-BF16.gguf", "mmproj-F32.gguf", "mmproj-Q8_0.gguf",
        "mmproj.gguf"]

    def f(path: str) -> HubFile:
        return HubFile(path, 10, "a" * 64)

    files = [f("sub/Gemma-Q4_K_M.gguf"), f("mmproj-F16.gguf"), f("sub/mmproj-F32.gguf"),
             f("sub/mmproj-gemma-bf16.gguf")]
    cand = Candidate("Q4_K_M", (files[0],))
    chosen = choose_projector(files, cand)
    assert chosen is not None and chosen.path == "sub/mmproj-gemma-bf16.gguf"  # same folder
    # none beside it: the repo root's (split quants in folders, the projector at the top)
    chosen = choose_projector([files[0], f("mmproj-F16.gguf"), f("other/mmproj-F16.gguf")],
                              cand)
    assert chosen is not None and chosen.path == "mmproj-F16.gguf"
    assert choose_projector([files[0], f("other/mmproj-F16.gguf")], cand) is None
