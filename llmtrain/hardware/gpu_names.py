"""Which hardware profile (configs/hardware/) a GPU is, from the name torch.cuda.get_device_name() reports."""

from __future__ import annotations

import re

# Most specific first: "H100 NVL" before "H100", "GH200" before "H200". Word boundaries keep "H20" from matching
# "H200", "A10" from "A100" or "A10G", and "L4" from "L40S"; a card with other peaks ("L40", "RTX 4090 D",
# "V100S", a plain "MI250") matches nothing rather than a neighbour's profile.
GPU_PROFILES = (
    (r"\bGH200\b", "gh200"),
    (r"\bGB200\b", "gb200"),
    (r"\bB200\b", "b200"),
    (r"\bH200 NVL\b", "h200-nvl"),
    (r"\bH200\b", "h200"),
    (r"\bH100 NVL\b", "h100-nvl"),
    (r"\bH100\b.*\bPCIe\b", "h100-pcie"),
    (r"\bH100\b", "h100"),
    (r"\bH20\b", "h20"),
    (r"\bA100\b", "a100"),
    (r"\bA10G\b", "a10g"),
    (r"\bA10\b", "a10"),
    (r"\bL40S\b", "l40s"),
    (r"\bL4\b", "l4"),
    (r"\bRTX 4090$", "rtx4090"),
    (r"\bRTX 6000 Ada\b", "rtx6000ada"),
    (r"\bV100\b", "v100"),
    (r"\bT4\b", "t4"),
    (r"\bMI250X\b", "mi250x"),
    (r"\bMI300X\b", "mi300x"),
)


def profile_for(device_name: str) -> str | None:
    """The profile of a GPU named `device_name`, or None when no profile matches it."""
    for pattern, profile in GPU_PROFILES:
        if re.search(pattern, device_name.strip(), re.IGNORECASE):
            return profile
    return None
