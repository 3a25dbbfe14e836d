#!/usr/bin/env python3
"""Write the tiny vision-language test pair: DIR/model.gguf and DIR/mmproj.gguf.

    python scripts/make_tiny_vlm.py DIR [--audio]

The text model is tests/tiny_models.py's 2-layer llama (n_embd 64); the projector is a
tiny LLaVA "mlp" projector (32x32 images, 8x8 patches -> 16 image tokens) with seeded
random weights, written by tests/tiny_vlm.py. llama.cpp's mtmd loads and runs the pair
(tests/model/test_tiny_vlm.py). `--audio` also writes DIR/mmproj-audio.gguf, a tiny
Ultravox-type audio projector (128 mel bins, 150 tokens per 30 s window) for the same
text model. With both in DIR, pass the one you mean explicitly (--mmproj).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tiny_vlm import TINY_AUDIO, TINY_PROJECTOR, write_tiny_audio, write_tiny_vlm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="folder to write model.gguf and mmproj.gguf in")
    parser.add_argument("--audio", action="store_true",
                        help="also write mmproj-audio.gguf (an Ultravox-type audio projector)")
    args = parser.parse_args(argv)
    model, mmproj = write_tiny_vlm(args.dir)
    p = TINY_PROJECTOR
    print(f"{model}\n{mmproj}  (mlp projector, {p.image_size}px images, "
          f"{p.patch_size}px patches, {p.image_tokens} tokens per image)")
    if args.audio:
        audio = write_tiny_audio(args.dir)
        print(f"{audio}  (ultravox projector, {TINY_AUDIO.n_mel} mel bins, "
              f"{TINY_AUDIO.tokens_per_window} tokens per 30 s window)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
