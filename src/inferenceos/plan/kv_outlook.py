"""What the tiered KV cache (engine/kv/store.py) would hold and save for a plan (pure).

`serve` keeps the KV state of finished turns in RAM, then on disk, and a returning
conversation restores its prefix instead of prefilling it (docs/engine.md, "The tiered
KV cache"). `kv_outlook` says, from the plan alone, how much of the memory that takes:
the state of one prompt-sized prefix (KV bytes per token × tokens), how many such
entries each tier's budget holds, and what a restore costs against a prefill again:
reading the state at the tier's rate (RAM at the CPU's bandwidth, disk at its measured
sequential rate) plus one decode step, since the prompt's last token is always
evaluated alone (engine/kv/store.py's last-token rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferenceos.plan.devices import Machine
from inferenceos.plan.memory import kv_bytes_per_token
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.plan import Plan


@dataclass(frozen=True)
class KVCacheOutlook:
    """The KV cache tiers' share of memory and what restoring a prefix saves."""

    ram_budget: int
    disk_budget: int
    prefix_tokens: int
    prefix_bytes: int  # the state of one prefix of `prefix_tokens` tokens
    restore_ram_s: float  # to first token, restored from the RAM tier
    restore_disk_s: float  # to first token, restored from the disk tier
    prefill_s: float  # to first token, prefilled again

    def entries(self, budget: int) -> int:
        """How many prefixes of this size a tier of `budget` bytes holds."""
        return budget // self.prefix_bytes if self.prefix_bytes > 0 else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "ram_budget_bytes": self.ram_budget, "disk_budget_bytes": self.disk_budget,
            "prefix_tokens": self.prefix_tokens, "prefix_bytes": self.prefix_bytes,
            "ram_entries": self.entries(self.ram_budget),
            "disk_entries": self.entries(self.disk_budget),
            "restore_ram_s": round(self.restore_ram_s, 4),
            "restore_disk_s": round(self.restore_disk_s, 4),
            "prefill_s": round(self.prefill_s, 4),
        }


def kv_outlook(facts: ModelFacts, plan: Plan, machine: Machine, prompt_tokens: int,
               prefill_tps: float, decode_tps: float, ram_budget: int,
               disk_budget: int) -> KVCacheOutlook:
    """The outlook for prefixes of `prompt_tokens` tokens under `plan`'s KV layout.

    `prefill_tps` / `decode_tps` are the prediction's own speeds; budgets are bytes
    (0: that tier is off, and its restore time is reported all the same)."""
    tokens = max(1, prompt_tokens)
    size = kv_bytes_per_token(facts, plan.ctx) * tokens
    step = 1.0 / decode_tps if decode_tps > 0 else 0.0
    ram_rate = machine.cpu.bandwidth_gbps * 1e9
    disk_rate = machine.disk_gbps * 1e9
    return KVCacheOutlook(
        ram_budget=ram_budget, disk_budget=disk_budget, prefix_tokens=tokens,
        prefix_bytes=size,
        restore_ram_s=(size / ram_rate if ram_rate > 0 else 0.0) + step,
        restore_disk_s=(size / disk_rate if disk_rate > 0 else 0.0) + step,
        prefill_s=tokens / prefill_tps if prefill_tps > 0 else float("inf"),
    )
