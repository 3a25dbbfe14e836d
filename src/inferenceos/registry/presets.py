"""Model presets: Ollama's Modelfile (FROM, SYSTEM, TEMPLATE, PARAMETER, ADAPTER,
MESSAGE) as a registry name.

A preset is a registry row of its base model's file (store.add_preset) carrying a
`Preset` as JSON: `list`, `cp`, `rm` and the server's name resolution treat it as any
other model, and the engine loads the same file (so the KV cache key, and the disk
tier's entries, are the base's). What the preset changes is applied per request by
the server (server/presets.py): its system prompt and messages go before a chat's
own, its parameters replace the values a request left at their defaults, its adapters
are the request's LoRA set.

Modelfile syntax (Ollama's): one instruction per line, case-insensitive, `#` comments;
an argument may be a `\"\"\"triple-quoted\"\"\"` string spanning lines or a
"double-quoted" one. `PARAMETER name value` may repeat (`stop` collects). `ADAPTER`
names a LoRA GGUF (a path, relative to the Modelfile's folder) or a blob digest; its
scale is 1. TEMPLATE is kept and shown (`/api/show`) but the model's own GGUF
template renders prompts: Ollama's templates are Go templates, not Jinja.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inferenceos.errors import UsageError
from inferenceos.registry.names import parse_digest

# Ollama's PARAMETER names and their types (stop: a list of strings)
PARAMETERS: dict[str, type] = {
    "temperature": float, "top_k": int, "top_p": float, "min_p": float,
    "num_predict": int, "repeat_penalty": float, "repeat_last_n": int, "seed": int,
    "presence_penalty": float, "frequency_penalty": float, "num_ctx": int, "stop": str,
}
ROLES = ("system", "user", "assistant")
MAX_MODELFILE = 1 << 20  # bytes: a Modelfile is text, not a model
_INSTRUCTION = re.compile(r"^\s*([A-Za-z]+)\s*(.*)$", re.S)


@dataclass(frozen=True)
class Preset:
    """What a preset adds to its base model `base` (a registry name). `adapters`:
    (blob digest, scale) of LoRA GGUFs in the store."""

    base: str
    system: str | None = None
    template: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    adapters: tuple[tuple[str, float], ...] = ()
    messages: tuple[tuple[str, str], ...] = ()  # (role, content)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Preset:
        d = json.loads(text)
        return cls(d["base"], d.get("system"), d.get("template"), dict(d.get("parameters") or {}),
                   tuple((str(a), float(s)) for a, s in d.get("adapters") or ()),
                   tuple((str(r), str(c)) for r, c in d.get("messages") or ()))

    def modelfile(self) -> str:
        """The preset as Modelfile text (what `/api/show` returns as `modelfile`)."""
        lines = [f"FROM {self.base}"]
        if self.template is not None:
            lines.append(f'TEMPLATE """{self.template}"""')
        if self.system is not None:
            lines.append(f'SYSTEM """{self.system}"""')
        for digest, scale in self.adapters:
            note = "" if scale == 1.0 else f" # scale {scale:g}"
            lines.append(f"ADAPTER @sha256:{digest}{note}")
        for name, value in self.parameters.items():
            for v in value if isinstance(value, list) else [value]:
                lines.append(f"PARAMETER {name} {json.dumps(v) if isinstance(v, str) else v}")
        for role, content in self.messages:
            lines.append(f'MESSAGE {role} """{content}"""')
        return "\n".join(lines) + "\n"

    def parameters_text(self) -> str:
        """Ollama's `parameters` field of /api/show: one `name value` per line."""
        out = []
        for name, value in self.parameters.items():
            for v in value if isinstance(value, list) else [value]:
                out.append(f"{name:<30} {json.dumps(v) if isinstance(v, str) else v}")
        return "\n".join(out)


@dataclass
class Modelfile:
    """A parsed Modelfile: FROM's argument and the rest, before anything is resolved
    (ADAPTER arguments are paths or `@sha256:` digests as written)."""

    from_: str = ""
    system: str | None = None
    template: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    adapters: list[str] = field(default_factory=list)
    messages: list[tuple[str, str]] = field(default_factory=list)


def _unquote(arg: str, lines: list[str], i: int) -> tuple[str, int]:
    """The argument starting `arg` (line i): a triple-quoted string may run over the
    following lines; returns (value, index of its last line)."""
    s = arg.strip()
    if s.startswith('"""'):
        rest = s[3:]
        while '"""' not in rest:
            i += 1
            if i >= len(lines):
                raise UsageError('Modelfile: unterminated """ string')
            rest += "\n" + lines[i]
        value, _, tail = rest.partition('"""')
        if tail.strip():
            raise UsageError(f'Modelfile: text after a closing """: {tail.strip()[:40]!r}')
        return value, i
    if len(s) >= 2 and s[0] == s[-1] == '"':
        return json.loads(s) if "\\" in s else s[1:-1], i
    return s, i


def parse_modelfile(text: str) -> Modelfile:
    """A Modelfile's instructions; UsageError (naming the line) for unknown ones, a
    missing FROM, a bad PARAMETER or MESSAGE."""
    if len(text.encode()) > MAX_MODELFILE:
        raise UsageError(f"a Modelfile must be under {MAX_MODELFILE} bytes")
    mf, lines, i = Modelfile(), text.splitlines(), 0
    while i < len(lines):
        line, n = lines[i], i + 1
        m = _INSTRUCTION.match(line)
        if not line.strip() or line.lstrip().startswith("#") or m is None:
            if line.strip() and not line.lstrip().startswith("#"):
                raise UsageError(f"Modelfile line {n}: expected an instruction, got {line[:40]!r}")
            i += 1
            continue
        op, arg = m.group(1).upper(), m.group(2)
        head = ""
        if op in ("PARAMETER", "MESSAGE"):  # a name or role, then the value
            head, _, arg = arg.strip().partition(" ")
        value, i = _unquote(arg, lines, i)
        _apply(mf, op, head, value, n)
        i += 1
    if not mf.from_:
        raise UsageError("the Modelfile has no FROM line (the base model)")
    return mf


def _apply(mf: Modelfile, op: str, head: str, value: str, n: int) -> None:
    if op == "FROM":
        mf.from_ = value
    elif op == "SYSTEM":
        mf.system = value
    elif op == "TEMPLATE":
        mf.template = value
    elif op == "ADAPTER":
        mf.adapters.append(value)
    elif op == "PARAMETER":
        add_parameter(mf.parameters, head.lower(), value, f"Modelfile line {n}")
    elif op == "MESSAGE":
        if head.lower() not in ROLES:
            raise UsageError(f"Modelfile line {n}: MESSAGE role must be one of {', '.join(ROLES)}")
        mf.messages.append((head.lower(), value))
    elif op != "LICENSE":  # LICENSE: accepted and ignored
        raise UsageError(f"Modelfile line {n}: unknown instruction {op}")


def add_parameter(params: dict[str, Any], name: str, value: Any, where: str) -> None:
    """Add `name` = `value` (text or a JSON value) to `params`, typed; `stop` collects."""
    kind = PARAMETERS.get(name)
    if kind is None:
        raise UsageError(f"{where}: unknown parameter {name!r} "
                         f"(known: {', '.join(sorted(PARAMETERS))})")
    try:
        typed = kind(value) if kind is not int else int(float(value))
    except (TypeError, ValueError):
        raise UsageError(f"{where}: parameter {name} must be a {kind.__name__}, "
                         f"got {str(value)[:40]!r}") from None
    if name == "stop":
        items = value if isinstance(value, list) else [typed]
        params.setdefault("stop", []).extend(str(s) for s in items)
    else:
        params[name] = typed


def json_parameters(raw: dict[str, Any] | None) -> dict[str, Any]:
    """`/api/create`'s `parameters` object, typed like PARAMETER lines."""
    out: dict[str, Any] = {}
    for name, value in (raw or {}).items():
        add_parameter(out, str(name).lower(), value, "parameters")
    return out


def store_blob_bytes(blobs: Path, digest: str, chunks: Iterable[bytes]) -> Path:
    """Write `chunks` to `blobs/sha256-<hex>`, hashing as they come: renamed into place
    only when their sha256 is `digest` (UsageError otherwise, nothing left behind)."""
    hex_ = parse_digest(digest)
    blobs.mkdir(parents=True, exist_ok=True)
    target = blobs / f"sha256-{hex_}"
    tmp = blobs / f".partial-blob-{os.getpid()}-{hex_[:16]}"
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                h.update(chunk)
                f.write(chunk)
        if h.hexdigest() != hex_:
            raise UsageError(f"digest mismatch: the bytes are sha256:{h.hexdigest()}, "
                             f"not {digest}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _adapter_digest(store: Any, ref: str, folder: Path | None, arch: str) -> str:
    """The blob digest of the ADAPTER `ref` (a `@sha256:`/`sha256:` digest of a blob in
    the store, or a LoRA GGUF path, copied into the store), checked to be a LoRA
    adapter for the architecture `arch`."""
    from inferenceos.model.gguf_file import read_gguf

    ref = ref.strip()
    if ref.lstrip("@").startswith("sha256"):
        path = store.blob_path(ref.lstrip("@"))
        if not path.is_file():
            raise UsageError(f"ADAPTER {ref[:80]}: no such blob (upload it to /api/blobs first)")
    else:
        path = Path(ref).expanduser()
        path = path if path.is_absolute() or folder is None else folder / path
        if not path.is_file():
            raise UsageError(f"ADAPTER {ref[:200]}: no such file")
    meta = read_gguf(path).metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise UsageError(f"ADAPTER {path.name}: not a LoRA adapter GGUF "
                         "(general.type adapter, adapter.type lora)")
    if meta.get("general.architecture") != arch:
        raise UsageError(f"ADAPTER {path.name}: made for {meta.get('general.architecture')}, "
                         f"the base model is {arch}")
    if ref.lstrip("@").startswith("sha256"):
        return parse_digest(ref.lstrip("@"))
    digest: str = store._store_blob(path, False, lambda _: None)
    return digest


def create_preset(store: Any, name: str, mf: Modelfile, folder: Path | None = None,
                  served: Callable[[str], tuple[Path, str] | None] | None = None) -> Any:
    """Register the preset `name` from the parsed Modelfile `mf` in the ModelStore
    `store` and return its ModelEntry. FROM names a registered model (a preset's own
    settings are inherited and overridden), a model the server serves from a file
    (`served(name)`: its (path, sha256 hex), registered in place), or a GGUF file
    (relative to `folder`, or a `@sha256:` blob), imported under `name` first.
    UsageError / ModelNotFoundError for what cannot be resolved."""
    ref = mf.from_.strip()
    as_file = ref.lstrip("@").startswith("sha256") or ref.lower().endswith(".gguf")
    file = served(ref) if served is not None and not as_file else None
    if file is not None:
        base_entry = store.register_in_place(file[0], name, file[1], str(file[0]))
        inherited = Preset(ref)
    elif as_file:
        path = (store.blob_path(ref.lstrip("@")) if ref.lstrip("@").startswith("sha256")
                else Path(ref).expanduser())
        if not path.is_absolute() and folder is not None:
            path = folder / path
        base_entry = store.import_file(path, name=name, projector=None)
        inherited = Preset(base_entry.name)
    else:
        base_entry = store.get(ref)
        inherited = (Preset.from_json(base_entry.preset) if base_entry.preset
                     else Preset(base_entry.name))
    params = {**inherited.parameters, **mf.parameters}
    adapters = (*inherited.adapters, *((_adapter_digest(store, a, folder,
                                                         base_entry.architecture), 1.0)
                                       for a in mf.adapters))
    preset = Preset(inherited.base, mf.system if mf.system is not None else inherited.system,
                    mf.template if mf.template is not None else inherited.template,
                    params, tuple(adapters),
                    tuple(mf.messages) if mf.messages else inherited.messages)
    return store.add_preset(name, base_entry, preset.to_json())
