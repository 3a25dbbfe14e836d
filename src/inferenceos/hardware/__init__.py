"""What this machine is: CPU, RAM, GPUs, what llama.cpp sees, measured bandwidths.

`get_profile()` returns the cached `HardwareProfile` while the machine's fingerprint is
unchanged and re-probes otherwise; `collect_profile()` always probes. Importing this
package is cheap: numpy and the probes load only when a profile is collected.
"""

from inferenceos.hardware.cache import ProfileResult, get_profile, load_cached, profile_path
from inferenceos.hardware.profile import (
    Bandwidth,
    CpuInfo,
    GpuInfo,
    HardwareProfile,
    LlamaDevice,
    LlamaInfo,
    LlamaSpeed,
    MemoryInfo,
    Recommendation,
)

__all__ = [
    "Bandwidth", "CpuInfo", "GpuInfo", "HardwareProfile", "LlamaDevice", "LlamaInfo", "LlamaSpeed",
    "MemoryInfo", "ProfileResult", "Recommendation", "get_profile", "load_cached",
    "profile_path",
]
