"""Ctrl-C in the run phase ends quietly: exit 130, nothing printed by asyncio at exit.

Before: SIGINT cancelled the lifecycle but left its phases running in a task of their own; they
saw the daemon's keeper stop under them and failed with ``LifecycleFailure('daemon: stopped')``
in a task nobody awaited, and the interpreter printed "Task exception was never retrieved" with
its traceback after the last event. The command is run through ``main()`` (not the console
script's ``entry``, which may end without the interpreter's teardown and so would hide what the
teardown prints). The unit test beside it: tests/test_phase_machine.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from ptyhelpers import clean_env
from simhelpers import free_tcp_port, quick_sim

pytestmark = pytest.mark.slow

MAIN = "import sys; from cuzk_supervisor.cli.main import main; sys.exit(main())"


def _in_the_run_phase(line: str) -> bool:
    """The run phase's /running report was sent: the phases are keeping the daemon up."""
    try:
        event = json.loads(line)
    except ValueError:
        return False
    return event.get("event") == "manager.report_done" and event.get("kind") == "running"


@pytest.mark.timeout(180)
def test_sigint_in_the_run_phase_exits_130_with_nothing_unheard(tmp_path: Path) -> None:
    health = f"127.0.0.1:{free_tcp_port()}"
    command = [sys.executable, "-c", MAIN, "sim", "--fresh", "--sim-dir", str(tmp_path / "sim"),
               "--health-listen", health, "--log-format", "json", *quick_sim()]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=clean_env())  # fmt: skip
    assert proc.stderr is not None
    seen: list[str] = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if _in_the_run_phase(line):
                proc.send_signal(signal.SIGINT)
                break
        else:
            pytest.fail("the run phase was never reached:\n" + "".join(seen[-20:]))
        rest = proc.stderr.read()
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Task exception was never retrieved" not in rest, rest[-3000:]
    assert "Traceback" not in rest, rest[-3000:]
    assert code == 128 + signal.SIGINT, rest[-3000:]
    stopping = [json.loads(line) for line in rest.splitlines() if '"supervisor.stopping"' in line]
    assert [e["signal"] for e in stopping] == ["SIGINT"]
