"""TTFT of new conversations that share a long system prompt, with the tiered KV cache
(entries at the prefixes conversations share: KVStore.branch_point) against without it,
paired in one run.

Each model is served by the server's own manager (`registry.manager`, one slot, the
engines `serve` builds). Each round, a new conversation (the shared system prompt of
~SYSTEM tokens + its own question, through the model's chat template) arrives after an
unrelated prompt took the slot, as on a server with other users; its first token is
timed. The first conversation meets an empty cache; from the second one on, the cache
holds the system prompt (stored when the second parted from the first). Gemma 3 has
sliding-window layers: there only whole entries restore, so before these entries new
conversations shared nothing.

    .venv/bin/python benchmarks/kv_system_prompt.py [--model A.gguf ...] [--system 1500]
        [--conversations 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inferenceos.engine.chat_template import ChatMessage
from inferenceos.plan.entry import LoadRequest
from inferenceos.registry.catalog import Catalog
from inferenceos.registry.manager import ModelManager, engine_factory
from inferenceos.registry.store import ModelStore
from kv_tiers import CACHE, DATA, ask

MODELS = [CACHE / "gemma-3-270m-q4_k_m.gguf", CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"]
QUESTIONS = ["Who wrote this?", "Name one grievance.", "Quote the first line.",
             "Which king is meant?", "Summarise it.", "What year is it from?"]
MiB = 1 << 20


def system_prompt(tokenize: Any, n_tokens: int) -> str:
    words = DATA.read_text(encoding="utf-8").split()
    text, i = "You answer questions about this document.\n", 0
    while len(tokenize(text)) < n_tokens:
        text += " ".join(words[i: i + 60]) + "\n"
        i += 60
    return text


def run(model: Path, tiers: bool, args: argparse.Namespace) -> list[tuple[float, int]]:
    with tempfile.TemporaryDirectory() as home:
        os.environ["INFERENCEOS_HOME"] = home
        catalog = Catalog(ModelStore(Path(home) / "models"))
        name = catalog.add_file(model, "m").name
        kv: dict[str, Any] = ({"kv_cache_ram": 512 * MiB, "kv_cache_disk": 4 << 30,
                               "kv_cache_dir": Path(home) / "kv-cache"} if tiers else {})
        mgr = ModelManager(catalog.resolve, factory=engine_factory(**kv), context_hint=None,
                           base=LoadRequest(n_ctx=args.system + 512, threads=args.threads,
                                             cached_turns=tiers))  # as serve plans
        try:
            with mgr.acquire(name) as lease:
                eng = lease.engine
                system = system_prompt(eng.tokenize, args.system)
                prompts = [eng.chat_prompt([ChatMessage("system", system),
                                            ChatMessage("user", q)])
                           for q in QUESTIONS[: args.conversations]]
            out = []
            for i, p in enumerate(prompts):
                ask(mgr, name, f"Unrelated request {i}: say hello.", n=2)  # takes the slot
                t = ask(mgr, name, p, n=2)
                out.append((t.ttft, t.cached))
            return out
        finally:
            mgr.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, action="append")
    ap.add_argument("--system", type=int, default=1500)
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    for model in args.model or MODELS:
        off = run(model, False, args)
        on = run(model, True, args)
        print(f"\n{model.name}, system prompt ~{args.system} tokens, {args.threads} threads")
        print("conversation  without cache ms (cached)  with cache ms (cached)  ratio")
        for i, ((a, ca), (b, cb)) in enumerate(zip(off, on, strict=True)):
            print(f"{i + 1:>12}  {a * 1000:>15.0f} ({ca:>5})  {b * 1000:>13.0f} ({cb:>5})"
                  f"  {a / b:>5.1f}x")
        later = [a / b for (a, _), (b, _) in zip(off[1:], on[1:], strict=True)]
        if later:
            print(f"median ratio, conversations 2+: {statistics.median(later):.1f}x")


if __name__ == "__main__":
    main()
