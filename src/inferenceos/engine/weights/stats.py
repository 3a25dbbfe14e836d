"""What the worker reports of its weights: `WeightStats`, one record of the stats message."""

from __future__ import annotations

from typing import TypedDict


class WeightStats(TypedDict, total=False):
    """The loaded model's weights in memory and on disk, `Stats`' "weights" record
    (engine/weights/residency.py says how each is measured). Bytes are file bytes."""

    resident_bytes: int  # planned to stay in memory (all of them when nothing streams)
    streamed_bytes: int  # planned to be read back from the file while decoding
    mapped_resident_bytes: int  # of llama.cpp's mapping in memory now; absent unmapped
    locked_bytes: int  # of the resident set mlock'ed (a streamed load only)
    tokens: int  # decoded since the load
    page_ins: int  # major page faults of the worker since the load
    read_bytes: int  # bytes the worker read from storage since the load
    page_ins_per_token: float  # over the last window with tokens decoded
    read_bytes_per_token: float
    expert_hit_ratio: float  # router picks on experts in memory (0-1); MoE streamed only
