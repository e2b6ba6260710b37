"""The simulated GPUs' hardware condition: what NVML would report about them and what their
faults do to the daemon's GPU steps (issue 34).

One small JSON file, ``gpus.json`` in the folder ``--gpu-dir`` names (``CUZK_SIM_GPU_DIR``),
so that it outlives the daemon, as a card's trouble does: the simulated daemon writes it when a
GPU fault fires and reads it at its start (a GPU lost stays lost across restarts), and the fake
NVML (:mod:`cuzk_supervisor.sim.machine.fakenvml`), in the supervisor's process, reads it to answer
as NVML would. Without ``--gpu-dir`` the condition lives in the daemon's memory only.

Per GPU: ``lost`` (why NVML cannot read it: its GPU steps fail), ``corrupt`` (its proofs fail
their self-check), ``crash`` (the daemon dies at its GPU steps), clocks held at ``clock_ratio``
with ``slowdowns``, and the ECC counters. XID events are a numbered list: the fake NVML's event
set delivers each one once. What an XID does: 79 loses the GPU; 48, 94 and 95 count an
uncorrected ECC error; 48 also retires a page (pending until a reset); 63 and 64 retire one.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from cuzk_supervisor.adapters.files import atomic_write

FILE = "gpus.json"
ECC_XIDS = frozenset({48, 94, 95})
RETIRING_XIDS = frozenset({48, 63, 64})
SLOWDOWN_BITS = {"power-cap": 0x4, "hw-slowdown": 0x8, "thermal": 0x20, "hw-thermal": 0x40,
                 "power-brake": 0x80}  # fmt: skip
"""NVML's clocks event reasons (``nvmlClocksEventReason*``) by the names the probe gives them."""
IDLE_BIT = 0x1


@dataclass(frozen=True, slots=True)
class GpuCondition:
    lost: str = ""
    corrupt: bool = False
    crash: bool = False
    clock_ratio: float = 1.0
    slowdowns: tuple[str, ...] = ()
    ecc_uncorrected: int = 0
    retired_pages: int = 0
    retirement_pending: bool = False


@dataclass(slots=True)
class GpuState:
    gpus: int = 1
    folder: Path | None = None
    conditions: dict[int, GpuCondition] = field(default_factory=dict)
    xids: list[tuple[int, int, int]] = field(default_factory=list)
    """(sequence number, GPU, XID), oldest first."""

    @classmethod
    def load(cls, folder: Path | None, gpus: int) -> GpuState:
        """The condition ``folder`` holds (a fresh one when it holds none or cannot be read)."""
        state = cls(gpus=gpus, folder=folder)
        if folder is None:
            return state
        try:
            raw = json.loads((folder / FILE).read_text())
        except (OSError, ValueError):
            return state
        state.read(raw)
        return state

    def read(self, raw: Any) -> None:
        if not isinstance(raw, dict):
            return
        for key, value in (raw.get("gpus") or {}).items():
            if isinstance(value, dict):
                known = {k: v for k, v in value.items() if k in GpuCondition.__slots__}
                known["slowdowns"] = tuple(known.get("slowdowns") or ())
                with contextlib.suppress(TypeError, ValueError):
                    self.conditions[int(key)] = GpuCondition(**known)
        self.xids = [
            (int(e[0]), int(e[1]), int(e[2])) for e in raw.get("xids") or () if len(e) == 3
        ]

    def condition(self, gpu: int) -> GpuCondition:
        return self.conditions.get(gpu, GpuCondition())

    def nvml_errors(self) -> dict[int, str]:
        """What NVML answers about each GPU it cannot read (a lost one), by index: the daemon's
        status shows it (``sim.gpus[i].fault``) as the fake NVML raises it."""
        return {
            gpu: f"NVMLError_GpuIsLost: GPU is lost (simulated: {condition.lost})"
            for gpu, condition in sorted(self.conditions.items())
            if condition.lost
        }

    # --- what the daemon's faults do ---------------------------------------------------------

    def _set(self, gpu: int, **changes: Any) -> None:
        self.conditions[gpu] = replace(self.condition(gpu), **changes)

    def xid(self, gpu: int, code: int) -> None:
        number = self.xids[-1][0] + 1 if self.xids else 1
        self.xids.append((number, gpu, code))
        now = self.condition(gpu)
        if code == 79:
            self._set(gpu, lost="fell off the bus")
        if code in ECC_XIDS:
            self._set(gpu, ecc_uncorrected=now.ecc_uncorrected + 1)
        if code in RETIRING_XIDS:
            self._set(gpu, retired_pages=self.condition(gpu).retired_pages + 1,
                      retirement_pending=True)  # fmt: skip
        self.save()

    def lose(self, gpu: int) -> None:
        """Fallen off the bus: an XID 79, and NVML no longer reads it."""
        self.xid(gpu, 79)

    def throttle(self, gpu: int, ratio: float, reason: str = "hw-slowdown") -> None:
        self._set(gpu, clock_ratio=ratio, slowdowns=(reason,))
        self.save()

    def corrupt(self, gpu: int) -> None:
        self._set(gpu, corrupt=True)
        self.save()

    def crash(self, gpu: int) -> None:
        self._set(gpu, crash=True)
        self.save()

    def save(self) -> None:
        """Written whole through a temp file (a reader never sees half of it; a file or link
        planted at a temp name is never written through: ``adapters.files``)."""
        if self.folder is None:
            return
        raw = {
            "gpus": {str(i): asdict(c) for i, c in sorted(self.conditions.items())},
            "xids": [list(e) for e in self.xids],
        }
        atomic_write(self.folder / FILE, json.dumps(raw).encode())


def gpu_and_number(arg: str, default_gpu: int = 0) -> tuple[float, int]:
    """A GPU fault's argument ``N`` or ``N@GPU`` (``xid:48@1``, ``throttle:0.5@0``)."""
    number, _, gpu = arg.partition("@")
    return float(number), int(gpu) if gpu else default_gpu
