"""Pre-run checks of a proving machine: ``cuzk-supervisor doctor``.

Each check answers one question a run would otherwise answer the hard way, minutes or hours in
(incidents I4 and I5: a plan that cannot fit, a disk that fills during the PCE build, a port
some other process holds). A check is a ``CheckResult(name, verdict, detail)``; the verdict is
``ok``, ``warn`` (the run can go on, but look) or ``fail`` (the run would not get through).
Doctor only looks: it makes no folder and leaves no file (``probes``).

Layout, as in the rest of the supervisor: ``results`` (rows, verdicts, exit status, figures),
``judges`` (pure verdict functions: plain facts in, a ``CheckResult`` out, no I/O), ``probes``
(what gathers those facts, all behind ``Probes``, so tests swap the GPU probe, the memory
sampler, the disk-usage function, the binary lookup, the port probe, the HTTP transport and the
clock) and ``checks`` (each check, and ``run_checks``, which orders them and never lets one
check's crash hide the others). Import from here.
"""

from cuzk_supervisor.cli.doctor.checks import (
    check_binary,
    check_c1,
    check_disk,
    check_folder,
    check_listens,
    check_memory,
    gather_gpus,
    probe_manager,
    run_checks,
)
from cuzk_supervisor.cli.doctor.judges import (
    DiskFacts,
    FolderFacts,
    GpuFacts,
    ListenFacts,
    ManagerFacts,
    MemoryFacts,
    disk_need_words,
    judge_binary,
    judge_c1,
    judge_disk,
    judge_folder,
    judge_gpus,
    judge_listens,
    judge_manager,
    judge_memory,
    judge_vram,
)
from cuzk_supervisor.cli.doctor.probes import (
    STATE_FILE,
    DiskUsage,
    Probes,
    could_create_in,
    listen_problem,
    nearest_existing,
    os_error_text,
    param_cache_need,
    present_param_bytes,
    previous_state,
    probe_folder,
    try_write,
)
from cuzk_supervisor.cli.doctor.results import (
    MANAGER_TIMEOUT_S,
    UNIX_PATH_MAX,
    CheckResult,
    Verdict,
    exit_code,
    fail,
    ok,
    overall,
    report,
    warn,
)
from cuzk_supervisor.core.disk import (
    PARAMS_BYTES,
    PCE_FILES_BYTES,
    REQUIRED_FREE_BYTES,
    DiskNeed,
    disk_need,
)

__all__ = [
    "MANAGER_TIMEOUT_S",
    "PARAMS_BYTES",
    "PCE_FILES_BYTES",
    "REQUIRED_FREE_BYTES",
    "STATE_FILE",
    "UNIX_PATH_MAX",
    "CheckResult",
    "DiskFacts",
    "DiskNeed",
    "DiskUsage",
    "FolderFacts",
    "GpuFacts",
    "ListenFacts",
    "ManagerFacts",
    "MemoryFacts",
    "Probes",
    "Verdict",
    "check_binary",
    "check_c1",
    "check_disk",
    "check_folder",
    "check_listens",
    "check_memory",
    "could_create_in",
    "disk_need",
    "disk_need_words",
    "exit_code",
    "fail",
    "gather_gpus",
    "judge_binary",
    "judge_c1",
    "judge_disk",
    "judge_folder",
    "judge_gpus",
    "judge_listens",
    "judge_manager",
    "judge_memory",
    "judge_vram",
    "listen_problem",
    "nearest_existing",
    "ok",
    "os_error_text",
    "overall",
    "param_cache_need",
    "present_param_bytes",
    "previous_state",
    "probe_folder",
    "probe_manager",
    "report",
    "run_checks",
    "try_write",
    "warn",
]
