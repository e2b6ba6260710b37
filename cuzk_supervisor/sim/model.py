"""The simulator's timing and memory model: pure numbers, no I/O, no clocks.

All durations are simulated seconds and all sizes simulated GiB; the daemon divides durations
by the time scale and multiplies sizes by the memory scale. Figures come from
``reference/cuzk.md`` §3 (one RTX 5070 Ti, 512 GiB host).
"""

from __future__ import annotations

import math
from bisect import bisect_left

from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.sim.machine import DEFAULT_VRAM_GIB

GIB = 1 << 30

# --- PoRep C2 pipeline -------------------------------------------------------------------
PARTITIONS_PER_POREP = 10
# Seconds one partition takes to synthesize when `active` partitions synthesize at once.
# Chosen so that steady-state seconds/proof = 10 * t_p(W) / W reproduces the table in
# cuzk.md §3 (290, 152, 68.4, 53.3, 42.5, 42.5 s for W = 1, 2, 5, 7, 10, 12).
SYNTHESIS_TABLE: tuple[tuple[int, float], ...] = (
    (1, 29.0),
    (2, 30.4),
    (5, 34.2),
    (7, 37.3),
    (10, 42.5),
    (12, 51.0),
)
GPU_SECONDS_PER_PARTITION = 3.0
# The share of the machine's CPU the model's synthesis uses with every limiter slot busy. A
# daemon given less (``--cpu-share F``) synthesizes max(1, SYNTHESIS_CPU_SHARE / F) times slower
# and its CPU is then all busy while the limiter is full.
SYNTHESIS_CPU_SHARE = 0.6
# The first proof without a PCE is slower in synthesis, then extracts the PCE (cuzk.md §3).
NO_PCE_SYNTHESIS_FACTOR = 1.4
PCE_EXTRACTION_SECONDS = 47.0
# The first proof after every start is slower again (incident I3); with the factors above the
# first proof at 2 workers takes 1.4 * 1.25 * 152 + 47 + 45 = 358 s, the field's 359 s warmup.
FIRST_PROOF_AFTER_START_FACTOR = 1.25
PCE_LOAD_SECONDS = 20.0
BUDGET_STARTUP_SECONDS = 3.0

# --- memory (simulated GiB) --------------------------------------------------------------
PARTITION_GIB = 15.0
BUDGET_RESERVATION_GIB = 14.0
PCE_GIB = 26.0
PCE_EXTRACTION_TRANSIENT_GIB = 14.0
SRS_GIB: dict[str, float] = {
    "porep-32g": 44.0,
    "porep-64g": 88.0,
    "wpost-32g": 57.0,
    "winning-32g": 0.2,
    "snap-32g": 33.0,
    "snap-64g": 66.0,
}
POREP_SRS_LOAD_SECONDS = 45.0
GPU_VRAM_GIB = DEFAULT_VRAM_GIB  # the default machine's (sim.machine, --vram-gib)
GPU_VRAM_PROVING_GIB = 12.0

# --- proof kinds ---------------------------------------------------------------------------
QUEUE_NAME = {
    pb.POREP_SEAL_COMMIT: "porep-c2",
    pb.SNAP_DEALS_UPDATE: "snap-update",
    pb.WINDOW_POST_PARTITION: "window-post",
    pb.WINNING_POST: "winning-post",
}
CIRCUIT = {
    pb.POREP_SEAL_COMMIT: "porep-32g",
    pb.SNAP_DEALS_UPDATE: "snap-32g",
    pb.WINDOW_POST_PARTITION: "wpost-32g",
    pb.WINNING_POST: "winning-32g",
}
# Non-PoRep kinds are one short step each.
SINGLE_STEP_SECONDS = {
    pb.SNAP_DEALS_UPDATE: 60.0,
    pb.WINDOW_POST_PARTITION: 30.0,
    pb.WINNING_POST: 2.0,
}
PROOF_BYTES = {
    pb.POREP_SEAL_COMMIT: 1920,  # 10 partitions x 192 bytes
    pb.SNAP_DEALS_UPDATE: 16 * 192,
    pb.WINDOW_POST_PARTITION: 192,
    pb.WINNING_POST: 192,
}


def partition_seconds(active: int) -> float:
    """Synthesis time of one partition started while ``active`` partitions synthesize.

    Linear between the table's points, linear extrapolation past the last one (memory
    bandwidth makes more than ~12 at once slower per partition).
    """
    n = max(1, active)
    xs = [x for x, _ in SYNTHESIS_TABLE]
    i = bisect_left(xs, n)
    if i < len(xs) and xs[i] == n:
        return SYNTHESIS_TABLE[i][1]
    # i > 0 here: the table starts at 1 and n >= 1 matched above if it were 1.
    lo, hi = (len(xs) - 2, len(xs) - 1) if i >= len(xs) else (i - 1, i)
    (x0, y0), (x1, y1) = SYNTHESIS_TABLE[lo], SYNTHESIS_TABLE[hi]
    return y0 + (y1 - y0) * (n - x0) / (x1 - x0)


def steady_state_seconds_per_proof(workers: int) -> float:
    """10 * t_p(W) / W: the table's s/proof when W partitions synthesize all the time."""
    return PARTITIONS_PER_POREP * partition_seconds(workers) / max(1, workers)


def cpu_slowdown(cpu_share: float) -> float:
    """How many times slower synthesis runs on ``cpu_share`` of the CPU it would use."""
    return max(1.0, SYNTHESIS_CPU_SHARE / cpu_share)


def cpu_busy_share(active: int, slots: int, cpu_share: float) -> float:
    """The machine's CPU busy share while ``active`` of ``slots`` partitions synthesize."""
    if slots < 1:
        return 0.0
    return min(1.0, active / slots * SYNTHESIS_CPU_SHARE / cpu_share)


def steady_state_proofs_per_hour(
    workers: int,
    concurrency: int,
    gpu_workers: int,
    synthesis_factor: float = 1.0,
    gpu_factor: float = 1.0,
) -> float:
    """Long-run PoRep rate of this model for a client keeping ``concurrency`` proofs in flight.

    ``active = min(workers, 10 * concurrency)`` partitions synthesize at once, and the GPU
    workers cap the rate at ``gpu_workers / 3 s`` partitions per second (``synthesis_factor``
    and ``gpu_factor`` stretch the two steps, as ``--synthesis-factor``/``--gpu-factor`` do). It
    is the exact long-run rate whenever the other proofs in flight keep the slots fed while one
    finishes on the GPU (``workers <= 10 * (concurrency - 1)``, e.g. 2 or 10 workers at
    concurrency 2); otherwise it is an upper bound (``pipeline.simulate_closed_loop`` gives the
    exact figure).
    """
    active = min(workers, PARTITIONS_PER_POREP * concurrency)
    if active < 1 or gpu_workers < 1:
        return 0.0
    synth_rate = active / (partition_seconds(active) * synthesis_factor)
    gpu_rate = gpu_workers / (GPU_SECONDS_PER_PARTITION * gpu_factor)
    return min(synth_rate, gpu_rate) * 3600.0 / PARTITIONS_PER_POREP


def budget_partition_slots(total_budget_bytes: int, max_parallel_synthesis: int) -> int:
    """Budget release: partitions at once = budget after SRS and PCE, 14 GiB each, capped."""
    spare = total_budget_bytes - int((SRS_GIB["porep-32g"] + PCE_GIB) * GIB)
    by_memory = spare // int(BUDGET_RESERVATION_GIB * GIB)
    return max(1, min(max_parallel_synthesis, by_memory))


def srs_load_seconds(circuit_id: str) -> float:
    """Cold load from disk: ~45 s for PoRep 32G's 44 GiB, in proportion to size, at least 1 s."""
    size = SRS_GIB[circuit_id]
    return max(1.0, POREP_SRS_LOAD_SECONDS * size / SRS_GIB["porep-32g"])


def gib_bytes(gib: float) -> int:
    return math.ceil(gib * GIB)
