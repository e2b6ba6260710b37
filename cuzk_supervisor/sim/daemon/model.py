"""The simulator's timing and memory model: pure numbers, no I/O, no clocks.

All durations are simulated seconds and all sizes simulated GiB; the daemon divides durations
by the time scale and multiplies sizes by the memory scale. Figures come from
``docs/daemon.md`` (one RTX 5070 Ti, 512 GiB host).
"""

from __future__ import annotations

import math

from cuzk_supervisor.proto import proving_pb2 as pb
from cuzk_supervisor.sim.machine import DEFAULT_VRAM_GIB

GIB = 1 << 30

# --- PoRep C2 pipeline -------------------------------------------------------------------
PARTITIONS_PER_POREP = 10
# Synthesis: the partitions synthesizing at once share the machine. Alone, one takes
# SYNTHESIS_ALONE_SECONDS (docs/daemon.md (figures): 290 s a proof at 1 worker). Each other
# partition synthesizing beside it slows it by CORE_SHARING (cores and caches shared), and together
# they cannot go faster than the memory bandwidth allows, SYNTHESIS_BANDWIDTH partitions a second
# (the table's plateau: 42.5 s a proof at 10 and 12 workers). A partition's speed follows the
# number synthesizing at each moment (``pipeline``: processor sharing), so with W always busy
# a proof takes 10 * partition_seconds(W) / W: 290, 152, 69.2, 53.4, 42.5, 42.5 s at
# W = 1, 2, 5, 7, 10, 12 against the table's 290, 152, 68.4, 53.3, 42.5, 42.5 (within 1.2 %).
SYNTHESIS_ALONE_SECONDS = 29.0
CORE_SHARING = 1.4 / 29.0
"""Each other partition synthesizing slows one by this share (30.4 s at 2, the table's 152/5)."""
SYNTHESIS_BANDWIDTH = 1 / 4.25
"""Partitions a second the machine's memory bandwidth lets synthesis finish, however many run."""
# The GPU stage of a partition (status.rs's gpu_ms, pickup to the finalizer's end): CPU
# preparation, a wait for the GPU (the GPU workers of one device take turns on it: one CUDA
# context, one mutex), the CUDA work, then the finalization on the CPU (b_g2_msm), which runs
# after the worker has already moved on to its next partition (engine.rs: split proving). So a
# GPU proves one partition per GPU_CUDA_SECONDS when its workers keep it fed, and an unqueued
# partition's gpu_ms is 4 s (docs/daemon.md (figures): 2-4 s of GPU).
GPU_PREP_SECONDS = 0.5
GPU_CUDA_SECONDS = 3.0
GPU_FINALIZE_SECONDS = 0.5
GPU_WORKERS_PER_DEVICE = 2
"""The config's default ``[gpus] gpu_workers_per_device``."""
# The CPU one partition's synthesis uses: a twentieth of the reference machine (its 12 workers
# use 0.6 of it; the cores-and-caches and bandwidth terms bind long before its CPU runs out). A
# daemon given F of that machine (``--cpu-share F``) has F / SYNTHESIS_CPU_PER_PARTITION
# partitions' worth: past that, the partitions synthesizing share it (a third term of
# partition_seconds), and its CPU busy share is n * SYNTHESIS_CPU_PER_PARTITION / F, at most 1.
SYNTHESIS_CPU_PER_PARTITION = 0.05
# The first proof without a PCE is slower in synthesis, then extracts the PCE (docs/daemon.md
# (figures)).
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


def partition_seconds(active: int, cpu_share: float | None = None) -> float:
    """Seconds one partition takes while ``active`` partitions synthesize throughout (at least
    one): its share of the cores, of the memory bandwidth, or of the CPU the daemon gets
    (``cpu_share`` of the reference machine; None: all of it), whichever binds."""
    n = max(1, active)
    cores = 1 + CORE_SHARING * (n - 1)
    bandwidth = n / (SYNTHESIS_BANDWIDTH * SYNTHESIS_ALONE_SECONDS)
    cpu = 0.0 if cpu_share is None else n * SYNTHESIS_CPU_PER_PARTITION / cpu_share
    return SYNTHESIS_ALONE_SECONDS * max(cores, bandwidth, cpu)


def steady_state_seconds_per_proof(workers: int) -> float:
    """10 * t_p(W) / W: seconds a proof when W partitions synthesize all the time."""
    return PARTITIONS_PER_POREP * partition_seconds(workers) / max(1, workers)


def cpu_busy_share(active: int, cpu_share: float) -> float:
    """The daemon's CPU busy share while ``active`` partitions synthesize on ``cpu_share``."""
    return min(1.0, max(0, active) * SYNTHESIS_CPU_PER_PARTITION / cpu_share)


def gpu_partitions_per_second(
    gpu_workers: int,
    workers_per_device: int = GPU_WORKERS_PER_DEVICE,
    gpu_factor: float = 1.0,
    cpu_factor: float = 1.0,
) -> float:
    """What the GPU stage can prove at most: on each device, its workers' preparations overlap
    the CUDA work of the others, so a device proves min(k / (prep + cuda), 1 / cuda) partitions
    a second with k workers (``gpu_factor`` stretches the CUDA work, ``cpu_factor`` the
    preparation: a slower GPU, a slower CPU around it)."""
    if gpu_workers < 1:
        return 0.0
    per = max(1, min(workers_per_device, gpu_workers))
    devices, rest = divmod(gpu_workers, per)
    cuda = GPU_CUDA_SECONDS * gpu_factor
    cycle = GPU_PREP_SECONDS * cpu_factor + cuda

    def device(k: int) -> float:
        return min(k / cycle, 1 / cuda)

    return devices * device(per) + (device(rest) if rest else 0.0)


def steady_state_proofs_per_hour(
    workers: int,
    concurrency: int,
    gpu_workers: int,
    synthesis_factor: float = 1.0,
    gpu_factor: float = 1.0,
    *,
    workers_per_device: int = GPU_WORKERS_PER_DEVICE,
    gpu_cpu_factor: float = 1.0,
    cpu_share: float | None = None,
) -> float:
    """Long-run PoRep rate of this model for a client keeping ``concurrency`` proofs in flight.

    ``active = min(workers, 10 * concurrency)`` partitions synthesize at once, and the GPU stage
    caps the rate at :func:`gpu_partitions_per_second` (``synthesis_factor`` and
    ``gpu_factor`` stretch the two steps, as ``--synthesis-factor``/``--gpu-factor`` do). It is
    the exact long-run rate whenever the other proofs in flight keep the slots fed while one
    finishes on the GPU (``workers <= 10 * (concurrency - 1)``, e.g. 2 or 10 workers at
    concurrency 2); otherwise it is an upper bound (``pipeline.simulate_closed_loop`` gives the
    exact figure).
    """
    active = min(workers, PARTITIONS_PER_POREP * concurrency)
    if active < 1 or gpu_workers < 1:
        return 0.0
    synth_rate = active / (partition_seconds(active, cpu_share) * synthesis_factor)
    gpu_rate = gpu_partitions_per_second(gpu_workers, workers_per_device, gpu_factor,
                                         gpu_cpu_factor)  # fmt: skip
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
