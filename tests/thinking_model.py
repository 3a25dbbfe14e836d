"""Qwen2.5-Coder-0.5B-Instruct with a chat template that opens a reasoning section.

Qwen2.5-Coder does not reason by itself. `THINKING_TEMPLATE` is its ChatML with the
assistant prefix Qwen3's template writes: `<think>\\n` after the generation prompt, or
an empty `<think>\\n\\n</think>\\n\\n` when `enable_thinking` is false. `thinking_qwen`
writes a copy of the real GGUF whose `tokenizer.chat_template` is that template, once
per template into the shared test cache: the model and its weights are the real ones,
only the template differs.

The copy keeps every byte after the template where it was relative to the aligned
tensor data: the new template is padded (inside a Jinja comment, which renders
nothing) to a length that keeps the data section's alignment.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

THINKING_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}"
    "{%- endif %}"
)
KEY = "tokenizer.chat_template"


def _template_span(src: Path) -> tuple[int, int, int]:
    """(start, end) of the template's string bytes (after its u64 length) in `src`,
    and the file's alignment."""
    from gguf import GGUFReader

    reader = GGUFReader(src)
    field = reader.fields[KEY]
    data = field.parts[field.data[0]]
    start = int(field.offset) + sum(int(p.nbytes) for p in field.parts[:field.data[0]])
    align = reader.fields.get("general.alignment")
    alignment = int(align.parts[align.data[0]][0]) if align is not None else 32
    return start, start + int(data.nbytes), alignment


def thinking_qwen(src: Path, cache: Path, template: str = THINKING_TEMPLATE) -> Path:
    """A copy of the GGUF `src` whose chat template is `template`, in `cache` (reused
    when there): the same model under another template."""
    digest = hashlib.sha256(template.encode() + str(src.stat().st_size).encode()).hexdigest()
    target = cache / f"{src.stem}-think-{digest[:12]}.gguf"
    if target.exists():
        return target
    start, end, alignment = _template_span(src)
    body = template.encode()
    wrap = len("{##}")
    pad = (-(len(body) + wrap - (end - start))) % alignment
    body += b"{#" + b" " * pad + b"#}"
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    with open(src, "rb") as fin, open(tmp, "wb") as fout:
        head = fin.read(start)
        fout.write(head[:-8] + len(body).to_bytes(8, "little") + body)
        fin.seek(end)
        while chunk := fin.read(1 << 24):
            fout.write(chunk)
    os.replace(tmp, target)
    return target
