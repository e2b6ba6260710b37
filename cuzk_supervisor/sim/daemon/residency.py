"""What the daemon keeps resident: the SRS per circuit and the PoRep PCE.

Loads take scaled time and really allocate (scaled) memory. The workers release reloads a
saved PCE; the budget release never does, so every start's first proof extracts it again.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from cuzk_supervisor.sim.clock import SimClock
from cuzk_supervisor.sim.daemon import model
from cuzk_supervisor.sim.daemon.logfmt import DaemonLog
from cuzk_supervisor.sim.daemon.memory import Memory

Release = Literal["workers", "budget"]
PceState = Literal["absent", "loading", "extracting", "ready"]
POREP_CIRCUIT = "porep-32g"


def pce_cache_path(param_cache: Path) -> Path:
    """Where the PCE is saved after extraction (and reloaded from by the workers release)."""
    return param_cache / "pce-porep-32g.bin"


class Residency:
    def __init__(
        self, *, release: Release, param_cache: Path, memory: Memory, log: DaemonLog
    ) -> None:
        self.release = release
        self.param_cache = param_cache
        self.memory = memory
        self.log = log
        self.clock: SimClock | None = None  # set by the engine once the loop runs
        self.srs: dict[str, Literal["loading", "loaded"]] = {}
        self._srs_ready: dict[str, asyncio.Event] = {}
        self.pce: PceState = "absent"
        self.stopped = False

    def loaded(self, circuit: str) -> bool:
        return self.srs.get(circuit) == "loaded"

    @property
    def pinned_gib(self) -> float:
        pinned = sum(model.SRS_GIB[c] for c in self.srs if self.loaded(c))
        return pinned + (model.PCE_GIB if self.pce == "ready" else 0.0)

    async def load_srs(self, circuit: str) -> float:
        """Load one SRS, blocking the caller for the scaled load time; returns the simulated
        seconds the caller waited (0 if it was already resident)."""
        assert self.clock is not None
        if self.loaded(circuit):
            return 0.0
        start = self.clock.now()
        if self.srs.get(circuit) == "loading":
            await self._srs_ready[circuit].wait()
            return self.clock.now() - start
        self.srs[circuit] = "loading"
        self._srs_ready[circuit] = asyncio.Event()
        seconds = model.srs_load_seconds(circuit)
        self.log.info(
            "cuzk_core::srs",
            "loading SRS from disk",
            circuit_id=circuit,
            param_cache=str(self.param_cache),
        )
        await self.clock.sleep(seconds)
        self.memory.alloc(("srs", circuit), model.SRS_GIB[circuit])
        self.srs[circuit] = "loaded"
        self._srs_ready[circuit].set()
        self.log.info(
            "cuzk_core::srs",
            "SRS loaded successfully",
            circuit_id=circuit,
            elapsed_ms=round(seconds * 1000),
            size_bytes=model.gib_bytes(model.SRS_GIB[circuit]),
        )
        return seconds

    async def load_pce_if_cached(self) -> None:
        """Workers release only: reload a PCE saved by an earlier run."""
        assert self.clock is not None
        path = pce_cache_path(self.param_cache)
        if self.release != "workers" or self.pce != "absent" or not path.exists():
            return
        self.pce = "loading"
        self.log.info("cuzk_core::pce", "loading PCE from disk", path=str(path))
        await self.clock.sleep(model.PCE_LOAD_SECONDS)
        self.memory.alloc("pce", model.PCE_GIB)
        self.pce = "ready"
        self.log.info(
            "cuzk_core::pce",
            "PCE loaded from disk",
            elapsed_ms=round(model.PCE_LOAD_SECONDS * 1000),
            size_bytes=model.gib_bytes(model.PCE_GIB),
        )

    def extract_pce(self, at: float, job_id: str, done: Callable[[float], None]) -> None:
        """Start the PCE extraction at simulated time ``at`` (14 GiB transient); ``done(t)``
        runs when it is resident and saved."""
        assert self.clock is not None
        self.pce = "extracting"
        self.log.info("cuzk_core::pce", "background PCE extraction starting", job_id=job_id)
        self.memory.alloc("pce-extraction", model.PCE_EXTRACTION_TRANSIENT_GIB)
        end = at + model.PCE_EXTRACTION_SECONDS
        self.clock.call_at(end, self._extracted, end, done)

    def _extracted(self, at: float, done: Callable[[float], None]) -> None:
        if self.stopped:
            return
        self.memory.alloc("pce", model.PCE_GIB)
        self.memory.free("pce-extraction")
        self.pce = "ready"
        self.log.info(
            "cuzk_core::pce",
            "background PCE extraction complete",
            elapsed_ms=round(model.PCE_EXTRACTION_SECONDS * 1000),
        )
        self._save_pce()
        done(at)

    def _save_pce(self) -> None:
        path = pce_cache_path(self.param_cache)
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(
                f'{{"circuit_id": "{POREP_CIRCUIT}", "simulated_gib": {model.PCE_GIB}}}\n'
            )
            os.replace(tmp, path)
        except OSError as exc:
            self.log.warn("cuzk_core::pce", "failed to save PCE to disk", path=str(path), error=exc)
            return
        self.log.info("cuzk_core::pce", "PCE saved to disk", path=str(path))
