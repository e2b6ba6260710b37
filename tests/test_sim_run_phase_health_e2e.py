"""The run phase's health watch through ``cuzk-supervisor sim`` (issue 44): the demo keeps the
simulated GPUs' condition in its own folder (SIM_DIR/gpus, the daemon's ``--gpu-dir``) and runs
the watch at its own pace, so a GPU fault given with ``--sim-fault`` is found, said in the
manager's ``setup`` tab and acted on as in the field (the fault matrix's ``run-phase-*`` rows,
wired by the tests themselves, are the same faults through ``run``). Nothing here sets the
watch's thresholds: they are the demo's."""

from __future__ import annotations

import shlex
import signal
from pathlib import Path
from typing import Any

import pytest
from daemonhelpers import Supervisor
from healthruns import demand_command, setup_lines
from lifecyclehelpers import reports
from managerhelpers import ManagerProcess
from pacehelpers import patient
from simhelpers import free_tcp_port, poll_until, quick_sim

from cuzk_supervisor import exitcodes

pytestmark = pytest.mark.slow

RUN_STARTS_AT = 5
"""Proofs of the full daemon's life when the run phase begins: settle 1, a fixed bench of 4."""


def start_sim(
    tmp_path: Path, mgr: ManagerProcess, faults: tuple[str, ...], *args: str
) -> Supervisor:
    sim_args = ["--sim-dir", str(tmp_path / "sim"), "--manager-url", mgr.url,
                "--health-listen", f"127.0.0.1:{free_tcp_port()}", "--log-format", "json",
                *quick_sim(), "--bench-precision", "0", *args]  # fmt: skip
    for fault in faults:
        sim_args += ["--sim-fault", fault]
    return Supervisor(sim_args, command="sim")


def with_demand(tmp_path: Path, time_scale: float) -> tuple[str, ...]:
    """curio's stand-in in the run phase (``sim.demand``): proofs for a fault to fire among."""
    port = free_tcp_port()
    command = demand_command(tmp_path / "sim", port, "busy:1000h@2", time_scale)
    return ("--daemon-listen", f"127.0.0.1:{port}", "--worker-commands", shlex.quote(command))


def said(mgr: ManagerProcess, run: Supervisor, text: str) -> list[dict[str, Any]]:
    uuid = run.named("manager.registered")[0]["uuid"]
    return [line for line in setup_lines(mgr, uuid) if text in line["text"]]


def test_a_gpu_lost_in_the_run_phase_ends_with_the_record_killed_and_the_reason_in_setup(
    tmp_path: Path, manager: Any
) -> None:
    mgr = manager()
    run = start_sim(tmp_path, mgr, (f"gpu-lost:0,after_s={patient(20):g}",))
    try:
        code = run.wait(180)
    finally:
        run.kill()
    assert code == exitcodes.HEALTH_BROKEN, run.describe()
    # The fault fired in the run phase (the daemon's own line), and the watch found it.
    fired = [e for e in run.named("child.line") if "sim fault firing" in str(e.get("line"))]
    assert [e["phase"] for e in fired] == ["run"], run.describe()
    (instance,) = mgr.instances()
    assert instance["state"] == "killed", instance
    assert instance["kill_reason"].startswith("bench_rate 0"), instance
    reason = said(mgr, run, "GPU 0 fell off the bus (XID 79)")
    assert reason, run.describe()
    # The reason was in the setup tab before the verdict that ended the record.
    told = reports(mgr, "/bench-done")[-1]
    assert told["json"]["rate"] == 0
    assert reason[0]["ts"] <= told["ts"] * 1000


@pytest.mark.parametrize(
    ("faults", "texts", "restarted_for"),
    [
        # XID 63 first (said, degraded: nothing to restart), then a partition stuck on the GPU.
        ((f"xid:63,after_proofs={RUN_STARTS_AT + 3},once={{tmp}}/m63",
          f"stuck,after_proofs={RUN_STARTS_AT + 5},once={{tmp}}/mstuck"),
         ("GPU 0: XID 63", "stuck on GPU 0"), "stuck on GPU 0"),
        ((f"xid:48,after_proofs={RUN_STARTS_AT + 3},once={{tmp}}/m48",),
         ("uncorrectable ECC error on GPU 0 (XID 48",), "(XID 48"),
    ],
    ids=["xid-63-then-stuck", "xid-48"],
)  # fmt: skip
def test_run_phase_faults_are_said_and_the_daemon_restarted_where_that_helps(
    tmp_path: Path, manager: Any, faults: tuple[str, ...], texts: tuple[str, ...],
    restarted_for: str,
) -> None:  # fmt: skip
    mgr = manager()
    scale = float(quick_sim()[1])
    specs = tuple(f.replace("{tmp}", str(tmp_path)) for f in faults)
    run = start_sim(tmp_path, mgr, specs, *with_demand(tmp_path, scale))
    try:

        def done() -> bool:
            # Said in setup, and the daemon restarted for it; the new one answered.
            if run.proc.poll() is not None:
                return True  # ended: the assertion below says how
            restarts = [e for e in run.named("health.restart") if restarted_for in e["reason"]]
            answered = [e for e in run.named("daemon.ready")
                        if restarts and e["timestamp"] > restarts[0]["timestamp"]]  # fmt: skip
            return bool(answered) and all(said(mgr, run, t) for t in texts)

        poll_until(done, 180, what="said, restarted")
        assert run.proc.poll() is None, run.describe()
        run.signal(signal.SIGTERM)
        code = run.wait(60)
    finally:
        run.kill()
    assert code == 128 + signal.SIGTERM, run.describe()
    # Said, acted on, nobody told: the manager's record lives on.
    (instance,) = mgr.instances()
    assert instance["state"] == "running", instance
    assert len(reports(mgr, "/bench-done")) == 1
