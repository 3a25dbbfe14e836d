"""Download speed of a Hub pull against huggingface_hub's own `hf_hub_download`, same run.

Both fetch the same file from the same loopback fake Hub (tests/fake_hub.py), in
alternating rounds: `registry.hub_download.download` (Range-resumable, sha256 computed
as the bytes arrive, fsynced) and `hf_hub_download(local_dir=...)` (huggingface_hub's
downloader; it checks the size, not the sha256). Prints each side's median MB/s and the
median of the rounds' own ratios (ours / theirs). Target: ratio >= 0.9 (hashing inline
costs little next to the transfer). Loopback has no network latency, so this measures the
client's own overhead; on a real link the transfer dominates both.

    .venv/bin/python benchmarks/hub_pull.py [--mb 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fake_hub import FakeHub  # noqa: E402
from inferenceos.registry.hub_download import download  # noqa: E402
from inferenceos.registry.hub_names import HubFile  # noqa: E402

REPO = "bench/Big-GGUF"
FILE = "Big-Q8_0.gguf"


def ours(hub: FakeHub, f: HubFile, work: Path) -> float:
    partial = work / f".download-{f.sha256}"
    t0 = time.perf_counter()
    for _ in download(f"{hub.url}/{REPO}/resolve/main/{FILE}", f, partial):
        pass
    dt = time.perf_counter() - t0
    partial.unlink()
    return dt


def theirs(work: Path) -> float:
    from huggingface_hub import hf_hub_download

    target = work / "hf"
    t0 = time.perf_counter()
    path = hf_hub_download(REPO, FILE, local_dir=target, force_download=True)
    dt = time.perf_counter() - t0
    Path(path).unlink()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    data = os.urandom(args.mb * 1024 * 1024)
    f = HubFile(FILE, len(data), hashlib.sha256(data).hexdigest())
    hub = FakeHub(repos={REPO: {FILE: data}}).start()
    os.environ["HF_ENDPOINT"] = hub.url
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    try:
        import huggingface_hub.constants as c

        c.ENDPOINT = hub.url  # read at import; the bench sets it before the first call
        c.HUGGINGFACE_CO_URL_TEMPLATE = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
        mine, base, ratios = [], [], []
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            for r in range(args.rounds):
                a, b = (ours(hub, f, work), theirs(work)) if r % 2 == 0 else \
                    tuple(reversed((theirs(work), ours(hub, f, work))))
                mine.append(args.mb / a)
                base.append(args.mb / b)
                ratios.append(mine[-1] / base[-1])
                print(f"round {r + 1}: ours {mine[-1]:.0f} MB/s, hf_hub_download "
                      f"{base[-1]:.0f} MB/s, ratio {ratios[-1]:.2f}")
    finally:
        hub.stop()
    print(f"median: ours {statistics.median(mine):.0f} MB/s, hf_hub_download "
          f"{statistics.median(base):.0f} MB/s; median ratio "
          f"{statistics.median(ratios):.2f} (target >= 0.9)")


if __name__ == "__main__":
    main()
