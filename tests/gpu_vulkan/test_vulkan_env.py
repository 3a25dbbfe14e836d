"""hardware/vulkan.py: when InferenceOS points llama.cpp's Vulkan backend at lavapipe.
These run in every venv (no Vulkan build needed): the choice is made from the files a
Vulkan build and Mesa leave, which the tests lay out in a temporary folder."""

from __future__ import annotations

from pathlib import Path

from inferenceos.hardware.profile import LlamaDevice, LlamaInfo
from inferenceos.hardware.vulkan import describe_llama_gpus, lavapipe_icd, vulkan_environment


def _vulkan_lib(tmp_path: Path) -> Path:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libggml-vulkan.so").write_bytes(b"")
    return lib


def test_lavapipe_chosen_on_a_machine_without_a_gpu(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    chosen = vulkan_environment(_vulkan_lib(tmp_path), env, icd="/x/lvp_icd.x86_64.json",
                                gpu_nodes=[])
    assert env == chosen == {"VK_ICD_FILENAMES": "/x/lvp_icd.x86_64.json",
                             "GGML_VK_VISIBLE_DEVICES": "0", "GGML_VK_DISABLE_F16": "1"}


def test_nothing_set_where_it_does_not_apply(tmp_path: Path) -> None:
    lib, icd = _vulkan_lib(tmp_path), "/x/lvp_icd.x86_64.json"
    cpu_lib = tmp_path / "cpu"
    cpu_lib.mkdir()
    # a CPU build, a machine with a GPU (ggml-vulkan's own choice stands), the user's
    # own device list or ICD (an empty GGML_VK_VISIBLE_DEVICES hides every device)
    cases: list[tuple[Path | None, list[str], dict[str, str]]] = [
        (cpu_lib, [], {}), (lib, ["/dev/dri/renderD128"], {}),
        (lib, [], {"GGML_VK_VISIBLE_DEVICES": ""}), (lib, [], {"VK_ICD_FILENAMES": "/o.json"}),
        (None, [], {})]
    for lib_dir, nodes, env in cases:
        before = dict(env)
        assert vulkan_environment(lib_dir, env, icd=icd, gpu_nodes=nodes) == {}
        assert env == before


def test_user_f16_choice_kept(tmp_path: Path) -> None:
    env = {"GGML_VK_DISABLE_F16": "0"}
    vulkan_environment(_vulkan_lib(tmp_path), env, icd="/x/lvp.json", gpu_nodes=[])
    assert env["GGML_VK_DISABLE_F16"] == "0" and env["GGML_VK_VISIBLE_DEVICES"] == "0"


def test_icd_found_by_name(tmp_path: Path) -> None:
    (tmp_path / "intel_icd.x86_64.json").write_text("{}")
    assert lavapipe_icd((str(tmp_path),)) is None
    (tmp_path / "lvp_icd.x86_64.json").write_text("{}")
    assert lavapipe_icd((str(tmp_path / "none"), str(tmp_path))) == str(
        tmp_path / "lvp_icd.x86_64.json")


def test_described_as_llama_cpp_sees_it() -> None:
    cpu = LlamaDevice("CPU", "AMD EPYC", "cpu", "CPU", 8 << 30, 8 << 30)
    lvp = LlamaDevice("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", "gpu", "Vulkan",
                      2 << 30, 2 << 30)
    assert describe_llama_gpus(LlamaInfo(loaded=True, devices=[cpu])) is None
    text = describe_llama_gpus(LlamaInfo(loaded=True, devices=[cpu, lvp]))
    assert text is not None
    assert "Vulkan0 (llvmpipe (LLVM 15.0.6, 256 bits), 2.0 GiB)" in text
    assert "lavapipe" in text and "computed by this CPU" in text
