"""Why a GPU's clocks were held down: NVML's clock event reasons, a bitmask, by name."""

from __future__ import annotations

# NVML's clock event reasons (nvmlClocksEventReason*), as a line names them
THROTTLE_REASONS = {
    0x1: "idle",
    0x2: "application clocks",
    0x4: "power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "thermal (software)",
    0x40: "thermal (hardware)",
    0x80: "power brake",
    0x100: "display clock",
}


def throttle_names(bits: int | None) -> list[str]:
    """The reasons a bitmask of NVML's clock events holds (idle left out: it holds no
    clock down while work runs)."""
    if not bits:
        return []
    return [name for bit, name in THROTTLE_REASONS.items() if bits & bit and bit != 0x1]
