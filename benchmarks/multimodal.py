"""An image on Gemma: encoder time and TTFT with an image against text alone, measured
and predicted by `simulate`, in one run.

No real vision model can be fetched here, so the projector is a LLaVA-"mlp"-type one of
realistic shape with seeded random weights (tests/tiny_vlm.py's writer): 224 px images in
14 px patches (256 image tokens), a ViT of `--layers` blocks at width 384 (ViT-S), its MLP
mapping to Gemma 3 270M's 640-wide embeddings. Timing does not depend on the weights'
values, so encoder and prefill times are those of a real ViT-S projector of that shape.

Each round (alternating order) runs, on one in-process engine (greedy, 1 token):
- text: a prompt of about `--prompt` tokens (a round-numbered prefix defeats the prefix
  cache);
- image: the same text plus one fresh image (a different image each round).
Measured: TTFT of each and the encoder's own time (MediaEncoder.encode_s). Predicted:
`simulate` for the same workload with and without `--image-tokens 256`.

    .venv/bin/python benchmarks/multimodal.py [--rounds 3] [--threads 2] [--layers 6]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

import numpy as np  # noqa: E402

from inferenceos.engine.local import LocalEngine  # noqa: E402
from inferenceos.engine.sampling import SamplingParams  # noqa: E402
from inferenceos.media.item import MEDIA_MARKER, MediaItem  # noqa: E402
from inferenceos.model.default_model import ensure_default_model  # noqa: E402
from inferenceos.paths import cache_dir  # noqa: E402
from inferenceos.plan.devices import local_machine  # noqa: E402
from inferenceos.plan.llama_params import LlamaParams  # noqa: E402
from inferenceos.plan.simulate import Workload, simulate  # noqa: E402
from tiny_vlm import TinyProjector, write_tiny_mmproj  # noqa: E402

ONE = SamplingParams(temperature=0.0, max_tokens=1)


def projector(layers: int) -> tuple[Path, TinyProjector]:
    """A ViT-S-shaped 'mlp' projector for Gemma's 640-wide embeddings (cached)."""
    shape = TinyProjector(image_size=224, patch_size=14, n_embd=384, n_head=6, n_ff=1536,
                          n_layer=layers + 1, proj_hidden=640, n_embd_text=640)
    path = cache_dir() / "bench" / f"mmproj-vits-{layers}l-640.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        write_tiny_mmproj(tmp, shape)
        tmp.replace(path)
    return path, shape


def image(seed: int) -> MediaItem:
    rgb = np.random.default_rng(seed).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    return MediaItem("image", rgb.tobytes(), 400, 300)


def text(round_no: int, n_words: int) -> str:
    words = " ".join(f"w{(i * 7 + round_no) % 97}" for i in range(n_words))
    return f"Round {round_no}. Describe what you see, then: {words}"


def measure(eng: LocalEngine, prompt: str, items: list[MediaItem]) -> tuple[float, float, int]:
    """(TTFT s, encoder s, prompt tokens) of one greedy 1-token generation."""
    media = eng._media
    assert media is not None
    before = media.encode_s
    gen = eng.generate(prompt, ONE, media=items)
    list(gen)
    return gen.metrics.ttft_s, media.encode_s - before, gen.metrics.prompt_tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=6, help="ViT blocks that run")
    ap.add_argument("--prompt", type=int, default=64, help="text words in the prompt")
    args = ap.parse_args()
    gemma = ensure_default_model()
    mmproj, shape = projector(args.layers)
    n_img = shape.image_tokens
    settings = LlamaParams(n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=args.threads)
    rows: dict[str, list[float]] = {"text": [], "image": [], "encode": []}
    n_text = 0
    with LocalEngine(gemma, settings, mmproj=mmproj, mmproj_gpu=False) as eng:
        measure(eng, MEDIA_MARKER + text(999, 8), [image(999)])  # warm-up: first encode allocates
        for r in range(args.rounds):
            order = ("text", "image") if r % 2 == 0 else ("image", "text")
            for kind in order:
                items = [image(r)] if kind == "image" else []
                prompt = (MEDIA_MARKER + "\n" if items else "") + text(r, args.prompt)
                ttft, enc, n = measure(eng, prompt, items)
                rows[kind].append(ttft)
                if items:
                    rows["encode"].append(enc)
                else:
                    n_text = n
    machine = local_machine()
    w = Workload(prompt_tokens=n_text, output_tokens=1, n_ctx=2048)
    plain = simulate(gemma, machine, w, threads=args.threads, mmproj=mmproj)
    seen = simulate(gemma, machine, replace(w, image_tokens=n_img), threads=args.threads,
                    mmproj=mmproj)
    med = {k: statistics.median(v) for k, v in rows.items()}
    pred_enc = seen.encoder.seconds if seen.encoder else 0.0
    print(f"Gemma 3 270M + ViT-S-shaped 'mlp' projector ({args.layers} blocks, 384 wide, "
          f"{shape.image_size}px/{shape.patch_size} = {n_img} image tokens), "
          f"{args.threads} threads, {args.rounds} rounds (medians), text prompt {n_text} tokens")
    print(f"{'':22}{'measured':>10}{'predicted':>11}{'pred/meas':>11}")
    for label, meas, pred in (("encoder (one image)", med["encode"], pred_enc),
                              ("TTFT text alone", med["text"], plain.ttft_s),
                              ("TTFT text + image", med["image"], seen.ttft_s)):
        print(f"{label:22}{meas * 1000:>8.0f}ms{pred * 1000:>9.0f}ms"
              f"{pred / meas if meas else 0:>10.2f}x")
    print(f"an image costs {med['image'] / med['text']:.2f}x the text-alone TTFT "
          f"(predicted {seen.ttft_s / plain.ttft_s:.2f}x); encoder share of the image TTFT "
          f"{med['encode'] / med['image']:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
