"""How long a proof's result stays unseen after its connection froze (issue 11).

    .venv/bin/python bench/frozen_recovery.py [--runs 5] [--await-deadline 1] [--time-scale 100]
                                              [--quick] [--json FILE]

Per run: a fresh simulated daemon (``python -m cuzk_supervisor.sim.daemon``) with the fault
``freeze:60,at_partition=9``: when the last partition of the proof starts, every open client
connection goes silent for good (no FIN, no RST: a frozen path) and new connections freeze too
for 60 simulated seconds. The proving client (``cuzk_supervisor.adapters.proving.client``, default
settings but the
await deadline) proves one PoRep proof; the proof ends a partition time after the freeze, on
the daemon, while the client's connection is dead.

Recovery = the moment the client has the result (``time.time()`` when ``prove`` returns) minus
the daemon's own timestamp of ``proof completed`` for that job. Target: at most
2 x ``await_deadline_s`` + 5 s (two cut awaits, then a new connection and the result at once).
Without the reconnect the client would wait for keepalive (6 min + 20 s) or its budget.

Prints a JSON list of ``{"name", "value", "unit", "target", "ok"}`` (first line), then a table
and the raw samples. ``--quick``: one run at time scale 1000. Exit 0 when every row holds a figure
and meets its target, 1 when one is NOT MEASURED, 3 when a target is missed (a quick run holds only
the targets of what must never happen: ``_harness.held``). (A run that fails is a note and one
sample fewer.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _harness import (
    ANSI_RE,
    PY,
    QUICK_TIME_SCALE,
    BenchError,
    Row,
    at_most,
    child_env,
    failed,
    finish,
    free_tcp_port,
    held,
    info,
    median,
    parse_ts,
    poll_until,
    print_table,
    standard_options,
)

from cuzk_supervisor.adapters.proving.client import ProvingClient
from cuzk_supervisor.adapters.proving.policy import ProvingTimeouts
from cuzk_supervisor.adapters.proving.proofinput import build_submit_request, load_c1
from cuzk_supervisor.address import parse_address
from cuzk_supervisor.sim.daemon.c1 import write_c1

FAULT = "freeze:60,at_partition=9"
COMPLETED_RE = re.compile(r"^(\S+Z)\s+INFO .*proof completed job_id=(\S+)")


@dataclass(frozen=True)
class Sample:
    recovery_s: float
    wall_s: float
    reconnects: int
    await_attempts: int
    submissions: int


def _completed_at(log: Path, job_id: str) -> float | None:
    for line in ANSI_RE.sub("", log.read_text(errors="replace")).splitlines():
        match = COMPLETED_RE.match(line)
        if match and match.group(2) == job_id:
            return parse_ts(match.group(1))
    return None


async def _prove(listen: str, c1: Path, job_id: str, timeouts: ProvingTimeouts) -> Sample:
    request = build_submit_request(load_c1(c1), request_id=job_id)
    async with ProvingClient(parse_address(listen), timeouts) as client:
        await client.wait_ready(30)
        result = await client.prove(request, budget_s=120)
        seen = time.time()
        reconnects = client.reconnects
    if not result.ok:
        raise BenchError(f"proof {job_id} did not complete: {result.error}")
    return Sample(seen, result.wall_s, reconnects, result.await_attempts, result.submissions)


def one_run(root: Path, index: int, timeouts: ProvingTimeouts, time_scale: float) -> Sample:
    folder = root / f"run{index}"
    folder.mkdir(parents=True)
    config = folder / "cuzk.toml"
    config.write_text(f'[synthesis]\npartition_workers = 2\n[srs]\nparam_cache = "{folder}"\n')
    c1 = folder / "c1.json"
    write_c1(c1, size_bytes=200_000)
    log = folder / "cuzk.log"
    listen = f"127.0.0.1:{free_tcp_port()}"
    argv = [PY, "-m", "cuzk_supervisor.sim.daemon", "--listen", listen, "--config", str(config),
            "--time-scale", f"{time_scale:g}", "--fault", FAULT]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=child_env({}))
    try:
        job_id = f"frozen-{index}"
        sample = asyncio.run(_prove(listen, c1, job_id, timeouts))
        ended = poll_until(lambda: _completed_at(log, job_id), 10, f"{job_id} completed line")
        if "froze client connections" not in log.read_text(errors="replace"):
            raise BenchError("the freeze fault never fired")
        return Sample(
            sample.recovery_s - ended,
            sample.wall_s,
            sample.reconnects,
            sample.await_attempts,
            sample.submissions,
        )
    finally:
        proc.kill()
        proc.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--await-deadline", type=float, default=1.0, metavar="S")
    parser.add_argument(
        "--time-scale", type=float, default=None, help=f"default 100; {QUICK_TIME_SCALE:g} quick"
    )
    standard_options(parser, f"1 run at time scale {QUICK_TIME_SCALE:g}")
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    scale = args.time_scale or (QUICK_TIME_SCALE if args.quick else 100.0)
    timeouts = ProvingTimeouts(await_deadline_s=args.await_deadline)
    target = 2 * timeouts.await_deadline_s + 5
    samples: list[Sample] = []
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="cuzk-frozen-") as tmp:
        for index in range(runs):
            try:
                samples.append(one_run(Path(tmp), index, timeouts, scale))
            except BenchError as exc:
                problems.append(f"run {index + 1}: {exc}")
                print(f"[frozen] run {index + 1}/{runs}: {exc}", file=sys.stderr, flush=True)
                continue
            print(f"[frozen] run {index + 1}/{runs}: {samples[-1]}", file=sys.stderr, flush=True)
    recoveries = [s.recovery_s for s in samples]
    name = f"recovery after a frozen connection (median of {len(samples)})"
    rows: list[Row] = (
        [
            at_most(name, median(recoveries), "s", target),
            at_most("recovery, worst run", max(recoveries), "s", target),
            info("reconnects per proof (median)", median([s.reconnects for s in samples]), ""),
            info("submissions per proof (max)", max(s.submissions for s in samples), ""),
        ]
        if samples
        else [failed(name, "s", f"<= {target:g}", "; ".join(problems))]
    )
    rows = held(rows, args.quick)
    print(json.dumps([r.as_dict() for r in rows]))
    print_table(rows)
    print()
    print(f"- await_deadline_s {timeouts.await_deadline_s:g} s, target 2 x that + 5 s = "
          f"{target:g} s; time scale {scale:g}; fault {FAULT}")  # fmt: skip
    print("- samples (recovery s): " + ", ".join(f"{r:.2f}" for r in recoveries))
    for problem in problems:
        print(f"- {problem}")
    return finish(rows, args.json)


if __name__ == "__main__":
    sys.exit(main())
