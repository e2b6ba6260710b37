"""The 400 s await loop of ``test_keepalive_strict.py``, run as a background process.

The loop is five real minutes of waiting that cannot be scaled (grpc-core's ping policy counts
real time). Run inside the test, it held one of the suite's two workers idle for 400 s, so for
that long the suite ran on one core. Started instead when the test is collected (``start``, by
whichever worker collects it first), it runs beside the suite, and the test reads what it
recorded (``read``), waiting only for what is left of the loop.

Run as a script: ``python keepaliveprobe.py FOLDER`` writes ``FOLDER/result.json`` (atomically)
and its own output to ``FOLDER/probe.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: the helpers

from simhelpers import SimProcess, free_tcp_port, submit_request, write_config

LOOP_S = 400.0
PROBE_LIMIT_S = LOOP_S + 100  # the probe's own end, whatever happens: it never outlives a run
RESULT = "result.json"
STARTED = "started"


def folder_for_run() -> Path:
    """The folder every worker of this pytest run shares (xdist's run id; without xdist the
    one pytest process's pid)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"cuzk-keepalive-{run}"


def start(folder: Path) -> bool:
    """Start the probe writing into ``folder``, unless another worker already did (the folder
    is made with ``mkdir``: exactly one caller makes it, and a planted link makes it fail)."""
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        return False
    with (folder / "probe.log").open("wb") as log:
        subprocess.Popen(
            [sys.executable, __file__, str(folder)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to pytest is not the probe's; its limit ends it
        )
    (folder / STARTED).write_text(f"{time.time()}\n")
    return True


def read(folder: Path) -> dict[str, Any] | None:
    """What the probe recorded, or None while it runs."""
    try:
        result: dict[str, Any] = json.loads((folder / RESULT).read_text())
        return result
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def log_tail(folder: Path) -> str:
    with contextlib.suppress(OSError):
        return (folder / "probe.log").read_text(errors="replace")[-3000:]
    return ""


async def _loop(listen: str) -> dict[str, Any]:
    from structlog.testing import capture_logs

    from cuzk_supervisor.adapters.proving.client import ProvingClient
    from cuzk_supervisor.adapters.proving.policy import ProvingTimeouts
    from cuzk_supervisor.address import parse_address

    with capture_logs() as events:
        async with ProvingClient(parse_address(listen), ProvingTimeouts()) as client:
            # Its job never ends: the client awaits it (30 s calls) until the budget is spent.
            started = time.monotonic()
            result = await client.prove(submit_request("loop"), budget_s=LOOP_S)
            elapsed = time.monotonic() - started
    retries = [e for e in events if e.get("event") == "proof.await_retry"]
    return {
        "elapsed_s": elapsed,
        "status": result.status.name,
        "retry_codes": [str(e.get("code")) for e in retries],
        "events_text": " ".join(str(e) for e in events),
    }


@contextlib.contextmanager
def stuck_sim(work: Path) -> Iterator[SimProcess]:
    """A strict-keepalive sim whose jobs never end (workers stopped after "stuck" arrived)."""
    config = write_config(work, synthesis={"partition_workers": 1}, srs={"param_cache": str(work)})
    sim = SimProcess.start(
        listen=f"127.0.0.1:{free_tcp_port()}", config=config, args=["--strict-keepalive"]
    )
    try:
        assert "keepalive=strict" in sim.wait_for_line("simulator settings")
        sim.stub().SubmitProof(submit_request("stuck"), timeout=5)
        sim.send(signal.SIGINT)
        sim.wait_for_line("stopping engine workers")
        yield sim
    finally:
        sim.kill()


def main(folder: Path) -> int:
    def out_of_time(signum: int, frame: object) -> None:
        raise SystemExit(f"keepalive probe: still running after {PROBE_LIMIT_S:g} s")

    signal.signal(signal.SIGALRM, out_of_time)  # ends it, with its sim (stuck_sim kills it)
    signal.alarm(int(PROBE_LIMIT_S))
    work = folder / "sim"
    work.mkdir()
    try:
        with stuck_sim(work) as sim:
            outcome = asyncio.run(_loop(sim.listen))
    except BaseException as exc:  # the test is waiting: tell it, rather than time it out
        outcome = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
    tmp = folder / f".{RESULT}.tmp"
    tmp.write_text(json.dumps(outcome))
    tmp.replace(folder / RESULT)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
