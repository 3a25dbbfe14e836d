"""A child process for tests/engine/weights/test_weight_residency_metrics.py: plan here (inside
whatever memory cgroup it was started in), load, decode greedily, and print one JSON
line: the RAM budget the plan saw, whether it streams, and the engine's `weights`
record (engine/weights/residency.py) after decoding.

    python tests/weight_residency_probe.py MODEL [--tokens N] [--plan-only]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--plan-only", action="store_true", help="print the budget, load nothing")
    ap.add_argument("--cap-above-start", type=int, default=0, metavar="BYTES",
                    help="after start-up, limit this process's cgroup to its charge + BYTES")
    a = ap.parse_args()

    from inferenceos.engine.llama.lib import lib
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.engine.scheduler import generate_one
    from inferenceos.engine.session import LoadedModel
    from inferenceos.engine.weights.residency import WeightResidency
    from inferenceos.plan.devices import local_machine
    from inferenceos.plan.entry import LoadRequest
    from inferenceos.plan.here import plan_here
    from inferenceos.plan.model_facts import load_model_facts

    lib()  # the library's start-up charge comes before the plan, as in ltm_probe.py
    cap = 0
    if a.cap_above_start:  # the limit: this run's own start-up charge plus N bytes
        from memcg import cap_own_memory

        cap = cap_own_memory(a.cap_above_start)
        print(f"capped at {cap}", file=sys.stderr, flush=True)
    machine = local_machine()
    req = LoadRequest(n_ctx=512, type_k="f16", type_v="f16")
    plan = plan_here(load_model_facts(a.model), machine, req).plan
    out: dict[str, object] = {"ram_budget": machine.cpu.memory_bytes, "cap": cap,
                              "disk_bound": plan.disk_bound}
    if a.plan_only:
        print(json.dumps(out))
        return 0
    with LoadedModel(Path(a.model), plan.params().per_sequence()) as m:
        streamer = m._streamer
        weights = WeightResidency.of(m, streamer)
        sampling = SamplingParams(temperature=0.0, max_tokens=a.tokens, ignore_eos=True)
        n = sum(ev.token >= 0 for ev in generate_one(m, m.tokenize("abc"), sampling))
        weights.count(n)
        out.update(streamed=streamer is not None, tokens=n, weights=weights.report(),
                   file_size=Path(a.model).stat().st_size)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
