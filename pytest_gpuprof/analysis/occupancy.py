"""How much of the GPU a kernel can use: its theoretical occupancy and the SMs its grid
covers, from its geometry (CUPTI's kernel records) and the device's limits. Pure code.

Occupancy follows CUDA's occupancy calculator (``cuda_occupancy.h``): the resident
blocks per SM are the least of the limits set by warps, blocks, registers (allocated per
warp in units, whole warps to each of the register file's sub-partitions) and shared
memory (per block, rounded to the allocation unit, plus what the system reserves per
block; the largest carveout). Coverage: a grid of ``blocks`` runs in waves of ``blocks_per_sm x SMs``; the full
waves cover every SM, the tail wave as many SMs as it has blocks (the scheduler spreads
blocks over SMs before stacking them), and the kernel's coverage is the mean over its
waves, each taken as equally long. A one-block kernel covers 1/132 of an H200.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SmLimits:
    """What one SM holds, and how many there are (``cudaDeviceProp``)."""

    sms: int
    max_threads: int = 2048
    max_blocks: int = 32
    registers: int = 65536
    shared: int = 233472  # bytes per SM the kernels may use
    reserved_shared: int = 1024  # bytes the system keeps per resident block
    warp_size: int = 32
    register_unit: int = 256  # registers are allocated per warp in units of this many
    partitions: int = 4  # the register file is split among this many sub-partitions
    shared_unit: int = 128  # shared memory is allocated per block in units of this many bytes


@dataclass(frozen=True, slots=True)
class Geometry:
    """A kernel launch's shape: blocks in the grid, threads per block, registers per
    thread and shared memory per block (static and dynamic, bytes)."""

    blocks: int
    threads: int
    registers: int = 0
    shared: int = 0


def blocks_per_sm(g: Geometry, sm: SmLimits) -> int:
    """The blocks of this kernel one SM can hold at once (0: it does not fit)."""
    if g.threads <= 0:
        return 0
    warps = math.ceil(g.threads / sm.warp_size)
    limits = [sm.max_blocks, (sm.max_threads // sm.warp_size) // warps]
    if g.registers > 0:
        # each sub-partition of the register file holds whole warps
        per_warp = math.ceil(g.registers * sm.warp_size / sm.register_unit) * sm.register_unit
        limits.append(((sm.registers // sm.partitions) // per_warp) * sm.partitions // warps)
    if g.shared > 0:
        per_block = math.ceil(g.shared / sm.shared_unit) * sm.shared_unit + sm.reserved_shared
        limits.append(sm.shared // per_block)
    return max(0, min(limits))


def occupancy(g: Geometry, sm: SmLimits) -> float:
    """Theoretical occupancy: resident warps over the SM's most."""
    resident = blocks_per_sm(g, sm) * math.ceil(g.threads / sm.warp_size)
    return resident / (sm.max_threads // sm.warp_size)


def coverage(g: Geometry, sm: SmLimits) -> float:
    """The fraction of the SMs the grid keeps busy, averaged over its waves."""
    per_sm = blocks_per_sm(g, sm)
    if g.blocks <= 0 or per_sm == 0:
        return 0.0
    wave = per_sm * sm.sms
    full, tail = divmod(g.blocks, wave)
    tail_sms = min(tail, sm.sms) / sm.sms
    waves = full + (1 if tail else 0)
    return (full + tail_sms) / waves
