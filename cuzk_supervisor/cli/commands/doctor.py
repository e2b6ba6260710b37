"""``cuzk-supervisor doctor``: check this machine before a run, one verdict per row.

Checks the daemon binary, the GPUs (through the configured ``gpu_probe``) and their VRAM, host
RAM and the cgroup limit with the worker plan they imply, free disk and write access at the
param cache, the state, run and log folders, the listen addresses, the manager (when
``manager_url`` is set) and the C1 input. Takes every setting ``run`` takes, from the same
flags, environment and file, so it checks the configuration the run will use.
"""

from __future__ import annotations

import argparse
import json

from cuzk_supervisor import settings
from cuzk_supervisor.cli import doctor
from cuzk_supervisor.cli.observe import configure_logging

EPILOG = """\
verdicts: ok; warn (the run can go on, but look); fail (the run would not get through).
exit status: 0 when the machine can run the benchmark (no fail row; warn rows allowed),
1 when any check fails, 2 for bad settings or flags (nothing was checked)."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "doctor",
        help="check this machine before a run (GPUs, memory, disk, folders, ports, manager)",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON (checks and overall) instead of a table"
    )
    settings.add_flags(parser)
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace, probes: doctor.Probes | None = None) -> int:
    s = settings.from_namespace(args).settings
    # Every finding is a row; the probes' own warnings (NVML missing) would only repeat them.
    configure_logging("error")
    results = doctor.run_checks(s, probes)
    if args.json:
        print(json.dumps(doctor.report(results), indent=2))
    else:
        print(format_table(results))
    return doctor.exit_code(results)


def format_table(results: list[doctor.CheckResult]) -> str:
    name_width = max((len(r.name) for r in results), default=4)
    lines = [f"{'check':<{name_width}}  verdict  detail"]
    lines += [f"{r.name:<{name_width}}  {r.verdict.value:<7}  {r.detail}" for r in results]
    verdict = doctor.overall(results)
    lines.append(f"overall: {verdict.value} (exit {doctor.exit_code(results)})")
    return "\n".join(lines)
