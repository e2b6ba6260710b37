"""``cuzk-supervisor doctor``: check this machine before a run, one verdict per row.

Checks the daemon binary, the GPUs and VRAM, the memory plan, free disk, the folders, the
addresses, the manager and the C1 file with the settings run would use: those below, and the
memory plan's (see plan --help), params_expected, allow_public_listen, manager_token,
manager_connect_timeout_s and health_enabled (flags as in run --help). It only looks: it makes
no folder and changes nothing.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from cuzk_supervisor import settings
from cuzk_supervisor.cli.observe import configure_logging

if TYPE_CHECKING:
    from cuzk_supervisor.cli.doctor import CheckResult, Probes

EPILOG = """\
verdicts: ok; warn (look, but the run can go on); fail (it would not get through). Exit 0
with no fail row, 1 with one, 2 for bad settings (nothing checked)."""

# What the rows are about: listed in --help.
CHECKED = (
    "daemon_binary",
    "daemon_listen",
    "daemon_status_listen",
    "daemon_param_cache",
    "gpu_probe",
    "c1_file",
    "manager_url",
    "health_listen",
)
# How the checks are made: taken as flags, documented by run and plan (named in the description).
ALSO_READ = (
    *(d.name for d in settings.select(["memory"])),
    "params_expected",
    "allow_public_listen",
    "manager_token",
    "manager_connect_timeout_s",
    "health_enabled",
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "doctor",
        help="check this machine before a run (GPUs, memory, disk, folders, ports, manager)",
        description=__doc__,
        epilog=EPILOG,
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    settings.add_flags(parser, ["folders"], names=CHECKED, unlisted=ALSO_READ)
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace, probes: Probes | None = None) -> int:
    # Imported here: only this command needs the checks (httpx).
    from cuzk_supervisor.cli import doctor
    from cuzk_supervisor.cli.simhandoff import machine_for

    s = settings.from_namespace(args).settings
    # Every finding is a row; the probes' own warnings (NVML missing) would only repeat them.
    configure_logging("error")
    # The machine the run would measure: the simulated one when the daemon is the simulator.
    results = doctor.run_checks(s, probes or doctor.Probes.of(machine_for(s)))
    if args.json:
        print(json.dumps(doctor.report(results), indent=2))
    else:
        print(format_table(results))
    return doctor.exit_code(results)


def format_table(results: list[CheckResult]) -> str:
    from cuzk_supervisor.cli import doctor

    name_width = max((len(r.name) for r in results), default=4)
    lines = [f"{'check':<{name_width}}  verdict  detail"]
    lines += [f"{r.name:<{name_width}}  {r.verdict.value:<7}  {r.detail}" for r in results]
    verdict = doctor.overall(results)
    lines.append(f"overall: {verdict.value} (exit {doctor.exit_code(results)})")
    return "\n".join(lines)
