"""Pre-run checks of a proving machine: ``cuzk-supervisor doctor``.

Each check answers one question a run would otherwise answer the hard way, minutes or hours in
(incidents I4 and I5: a plan that cannot fit, a disk that fills during the PCE build, a port
some other process holds). A check is a ``CheckResult(name, verdict, detail)``; the verdict is
``ok``, ``warn`` (the run can go on, but look) or ``fail`` (the run would not get through).
Doctor only looks: it makes no folder and leaves no file (``probes``).

Layout: ``results`` (rows, verdicts, exit status, figures), ``judges`` (pure verdicts: plain
facts in, a ``CheckResult`` out), ``probes`` (what gathers those facts, behind ``Probes``, which
tests swap) and ``checks`` (each check, and ``run_checks``, which orders them).
"""

from cuzk_supervisor.cli.doctor.checks import gather_gpus, run_checks
from cuzk_supervisor.cli.doctor.judges import GpuFacts, disk_need_words, judge_gpus, judge_vram
from cuzk_supervisor.cli.doctor.probes import STATE_FILE, Probes, listen_problem
from cuzk_supervisor.cli.doctor.results import CheckResult, Verdict, exit_code, overall, report
from cuzk_supervisor.core.disk import PARAMS_BYTES, PCE_FILES_BYTES, REQUIRED_FREE_BYTES, disk_need

__all__ = [
    "PARAMS_BYTES",
    "PCE_FILES_BYTES",
    "REQUIRED_FREE_BYTES",
    "STATE_FILE",
    "CheckResult",
    "GpuFacts",
    "Probes",
    "Verdict",
    "disk_need",
    "disk_need_words",
    "exit_code",
    "gather_gpus",
    "judge_gpus",
    "judge_vram",
    "listen_problem",
    "overall",
    "report",
    "run_checks",
]
