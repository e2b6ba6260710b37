"""How to run the daemon (``DaemonSettings``), how a start fails, and the edges it is run through
(spawner, readiness and liveness probes over gRPC, the process tree's RSS).

Plain values shared by ``DaemonProcess``, the keeper and the worker commands.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuzk_supervisor.adapters.machine.proctree import ProcessTree
from cuzk_supervisor.address import Address
from cuzk_supervisor.core.exits import DaemonExit

# A coroutine function (run as a task beside the wait for an early exit); one GetStatus with a
# deadline, raising when the daemon does not answer in time.
ReadyProbe = Callable[[Address, float], Coroutine[Any, Any, None]]
AliveProbe = Callable[[Address, float], Awaitable[None]]
# asyncio.create_subprocess_exec, or reaper.Reaper.spawn which also claims the pid from the reaper.
Spawner = Callable[..., Awaitable[asyncio.subprocess.Process]]
READY_LINE = re.compile(r"\bcuzk-daemon ready\b")
"""The daemon's ready line (docs/daemon.md: ``cuzk-daemon ready, serving on <addr>``)."""


@dataclass(frozen=True, slots=True)
class DaemonSettings:
    """How to run the daemon. Every field is a supervisor setting."""

    binary: str = "cuzk"
    extra_args: tuple[str, ...] = ()
    config_path: Path = Path("/run/cuzk-supervisor/cuzk.toml")
    base_config: Path | None = None
    log_path: Path | None = Path("/var/log/cuzk-supervisor/cuzk.log")
    log_max_bytes: int = 64 * 1024 * 1024
    log_backups: int = 3
    log_events_per_second: float = 500.0
    startup_deadline_s: float = 900.0
    stop_grace_s: float = 10.0
    # Liveness after ready (the kubelet's split: a long startup budget, then a cheap probe).
    # GetStatus runs nvidia-smi on the real daemon: not more often than every 15 s.
    liveness_interval_s: float = 30.0
    liveness_timeout_s: float = 20.0
    liveness_failures: int = 3
    cgroup_dir: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)


class DaemonStartFailed(Exception):
    """The daemon never became ready; ``exit`` says why (kind ``failed_to_start``)."""

    def __init__(self, exit: DaemonExit) -> None:
        super().__init__(exit.reason)
        self.exit = exit


# The RSS of a process and all its descendants, in bytes; None once the process is gone.
RssSampler = Callable[[int], int | None]


def tree_rss_sampler(tree: ProcessTree | None = None) -> RssSampler:
    tree = tree if tree is not None else ProcessTree()

    def sample(pid: int) -> int | None:
        found = tree.rss(pid)
        return None if found is None else found.rss

    return sample


async def grpc_alive_probe(address: Address, timeout_s: float) -> None:
    from cuzk_supervisor.adapters.proving.client import ProvingClient
    from cuzk_supervisor.adapters.proving.policy import ProvingTimeouts

    timeouts = ProvingTimeouts(call_deadline_s=timeout_s)
    async with ProvingClient(address, timeouts) as client:
        await client.status()


async def grpc_ready_probe(address: Address, deadline_s: float) -> None:
    from cuzk_supervisor.adapters.proving.client import ProvingClient
    from cuzk_supervisor.adapters.proving.policy import ProvingTimeouts

    async with ProvingClient(address, ProvingTimeouts()) as client:
        await client.wait_ready(deadline_s)
