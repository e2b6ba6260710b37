"""What the plan and params phases are given: the machine's memory and GPUs as the plan sees
them (``PlanResources``), and the params fetch (``ParamsFetch``). Built by the composition root
(``cuzk_supervisor.compose``); tests of the phase machine give fakes (``ports``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from cuzk_supervisor.adapters import params
from cuzk_supervisor.adapters.logship.shipper import LogShipper
from cuzk_supervisor.adapters.machine.gpu import GpuDevice, GpuProbe
from cuzk_supervisor.adapters.machine.resources import MemorySampler, MemorySnapshot
from cuzk_supervisor.daemon.output import OutputPump
from cuzk_supervisor.daemon.process import Spawner
from cuzk_supervisor.lifecycle.values import FetchSettings


@dataclass(frozen=True)
class PlanResources:
    """Memory and GPUs as the plan sees them (NVML can stall: never in the event loop)."""

    sampler: MemorySampler
    gpu: GpuProbe

    def sample(self) -> MemorySnapshot:
        return self.sampler.sample()

    async def gpus(self) -> Sequence[GpuDevice]:
        if not self.gpu.available:
            return []
        return await asyncio.to_thread(self.gpu.devices)


@dataclass(frozen=True)
class ParamsFetch:
    """The params phase's effect: the fetch command run under the reaper, its output shipped to
    the setup tab, its progress logged (``params.progress``: the terminal view's live line), the
    files verified."""

    config: FetchSettings
    spawn: Spawner
    shipper: LogShipper

    async def __call__(self, expected: Sequence[params.ExpectedFile], fetch_command: str) -> None:
        pump = OutputPump("setup", None)
        pump.add_sink(self.shipper.child_tab("setup", "fetch"))
        c = self.config
        await params.ensure_params(
            c.daemon_param_cache, expected, fetch_command, timeout_s=c.params_timeout_s,
            progress_interval_s=c.params_progress_interval_s, spawn=self.spawn, pump=pump,
            pidfile=c.state_dir / "fetch.pid", lock_wait_s=c.params_lock_wait_s,
        )  # fmt: skip
