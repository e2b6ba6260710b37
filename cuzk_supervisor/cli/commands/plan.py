"""``cuzk-supervisor plan``: the worker plan for this machine and why, on any machine.

Reads host RAM, the container's memory cgroup and the GPUs (NVML; none is fine), applies the
memory rule, and prints each number with its reason. ``--host-gib``, ``--cgroup-gib``, ``--gpus``
and ``--vram-gib`` answer "what if" for another machine.
"""

from __future__ import annotations

import argparse
import json

from cuzk_supervisor import exitcodes, settings
from cuzk_supervisor.adapters.machine.gpu import GpuProbe, StaticProbe, total_vram
from cuzk_supervisor.cli.observe import configure_logging
from cuzk_supervisor.core.memory import PlanInputs
from cuzk_supervisor.core.plan import PlanRefusal, plan_workers
from cuzk_supervisor.core.units import GIB


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "plan", help="print the worker plan for this machine and why", description=__doc__
    )
    what_if = parser.add_argument_group("what if (another machine)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    what_if.add_argument(
        "--host-gib", type=float, metavar="GIB", help="the host's RAM (default: measured)"
    )
    what_if.add_argument(
        "--cgroup-gib", type=float, metavar="GIB", help="the cgroup limit (default: measured)"
    )
    what_if.add_argument(
        "--gpus", type=int, metavar="N", help="this many GPUs (default: the ones gpu_probe sees)"
    )
    what_if.add_argument(
        "--vram-gib", type=float, default=24.0, metavar="GIB",
        help="VRAM per GPU for --gpus (default: 24)",
    )  # fmt: skip
    settings.add_flags(parser, ["memory"])
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    # Not for --help: the machine's probes, the simulated one's when the daemon is the simulator.
    from cuzk_supervisor.cli.simhandoff import machine_for
    from cuzk_supervisor.core.memory import MemoryPolicy
    from cuzk_supervisor.settings.policies import policy

    s = settings.from_namespace(args).settings
    configure_logging("warning" if not args.json else "error")
    snapshot = machine_for(s).memory_sampler(s).sample()
    host = int(args.host_gib * GIB) if args.host_gib else snapshot.host_total
    cgroup = int(args.cgroup_gib * GIB) if args.cgroup_gib else snapshot.cgroup_limit
    probe: GpuProbe
    if args.gpus is not None:
        probe = StaticProbe.uniform(args.gpus, args.vram_gib)
    elif s.gpu_probe == "nvml":
        from cuzk_supervisor.adapters.machine.gpunvml import NvmlProbe

        probe = NvmlProbe()
    else:
        probe = StaticProbe(())
    devices = probe.devices() if probe.available else []
    inputs = PlanInputs(
        host_total_bytes=host,
        cgroup_limit_bytes=cgroup,
        gpu_vram_total_bytes=tuple(d.total_bytes for d in devices),
        workers_override=s.workers or None,
        memory_scale=s.plan_memory_scale,
    )
    result = plan_workers(inputs, policy(MemoryPolicy, s))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        _print_table(result, devices, probe.reason if not probe.available else "")
    return exitcodes.OUT_OF_MEMORY if isinstance(result, PlanRefusal) else exitcodes.OK


def _print_table(result: object, devices: list, gpu_note: str) -> None:
    if isinstance(result, PlanRefusal):
        print(f"REFUSED: {result.reason}")
        return
    rows = result.rows()  # type: ignore[attr-defined]
    width = max(len(name) for name, _, _ in rows)
    value_width = max(len(value) for _, value, _ in rows)
    for name, value, reason in rows:
        print(f"{name:<{width}}  {value:>{value_width}}  {reason}")
    if devices:
        print(f"GPUs: {len(devices)} x {devices[0].name}, {total_vram(devices) / GIB:.0f} GiB VRAM")
    elif gpu_note:
        print(f"GPUs: none seen ({gpu_note})")
    for note in result.notes:  # type: ignore[attr-defined]
        print(f"note: {note}")
