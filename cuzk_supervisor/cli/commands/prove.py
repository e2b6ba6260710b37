"""``cuzk-supervisor prove``: one proof or a small batch against any daemon (real or simulated).

Replaces cuzk-bench's ``single`` and ``batch`` without their one long ``Prove`` call: each proof
is a submit and then short awaits (see ``cuzk_supervisor.adapters.proving``). Its settings are
the product's own, read as every command reads them (flag > ``CUZK_SUPERVISOR_*`` >
``--config-file`` > default): ``c1_file``, ``submit_deadline_s``, ``await_deadline_s``,
``proof_budget_s``, ``log_level``, ``log_format``; without ``--addr`` it asks the daemon ``run``
starts (``daemon_listen``, else the socket in ``run_dir``). Everything is checked before
anything connects; bad input is a one-line error and exit code 2; a daemon that never answers is
exit 3, with its address named. While it waits it says so (``proveprogress``); at the end it
reports proofs per hour in wall time and in the daemon's own time (``provereport``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import structlog

from cuzk_supervisor import exitcodes, settings
from cuzk_supervisor.adapters.proofinput import (
    PROOF_KINDS,
    build_submit_request,
    c1_proof_kind,
    load_c1,
)
from cuzk_supervisor.adapters.proving import ProvingClient
from cuzk_supervisor.adapters.provingbatch import run_batch
from cuzk_supervisor.adapters.provingerrors import DaemonNotReady
from cuzk_supervisor.adapters.provingpolicy import ProvingTimeouts
from cuzk_supervisor.adapters.provingresults import ProofResult
from cuzk_supervisor.address import Address, parse_address
from cuzk_supervisor.cli.commands import proveprogress as progress
from cuzk_supervisor.cli.commands import provereport as report
from cuzk_supervisor.cli.observe import configure_logging
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.proto import proving_pb2 as pb

T = TypeVar("T")
DEFAULT_READY_DEADLINE_S = 30.0

SETTINGS_USED = (
    "c1_file",
    "submit_deadline_s",
    "await_deadline_s",
    "proof_budget_s",
    "log_level",
    "log_format",
)
"""The settings ``prove`` has flags for. Every other one is read from the environment and the
file too, and checked, as every command does (``daemon_listen``, ``run_dir`` and
``daemon_status_listen`` are used)."""

DESCRIPTION = """\
Submit proofs to a cuzk daemon (real or simulated) and await them with short deadlines. Prints
one line per proof as it ends and a summary: proofs per hour (completed / wall time from the
first submit to the last end x 3600), and the same in the daemon's own time (its total_ms
against the wall time: the simulator's clock runs --time-scale times faster).

The C1 file and the deadlines are the settings run uses for its proofs (a first proof after a
daemon start builds the PCE: give it --proof-budget-s 3600). Without --addr it asks the daemon
run starts (daemon_listen, else cuzk.sock in run_dir).

While it waits for the daemon and while proofs run, it says so every {interval} s: off a
terminal a prove.waiting or prove.progress event (JSON lines on stderr, log level info unless
log_level is set); on a terminal a live line, and log lines from warning up unless log_level is
set.

Exit 0 if every proof completed, 1 if any failed, 2 on bad input, 3 if no daemon answers at the
address within --ready-deadline-s.
"""

log = structlog.get_logger("cuzk_supervisor.prove")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "prove",
        help="run one proof or a small batch against a daemon and report the rate",
        description=DESCRIPTION.format(interval=f"{progress.PROGRESS_INTERVAL_S:g}"),
        allow_abbrev=False,
    )
    own = parser.add_argument_group("prove")
    own.add_argument(
        "--addr",
        default=None,
        metavar="ADDR",
        help="daemon address, ip:port or unix:///path (default: the daemon run starts, "
        "daemon_listen, else cuzk.sock in run_dir)",
    )
    own.add_argument("--count", type=int, default=1, metavar="N", help="proofs to run (default: 1)")
    own.add_argument(
        "--concurrency",
        type=int,
        default=1,
        metavar="N",
        help="proofs in flight at once (default: 1)",
    )
    own.add_argument(
        "--kind",
        default="porep",
        metavar="KIND",
        help=f"proof kind: {', '.join(PROOF_KINDS)} (default: porep)",
    )
    own.add_argument(
        "--ready-deadline-s",
        type=float,
        default=DEFAULT_READY_DEADLINE_S,
        metavar="SECONDS",
        help="how long to wait for the daemon to answer GetStatus before proving; then exit 3 "
        f"(default: {DEFAULT_READY_DEADLINE_S:g})",
    )
    own.add_argument("--json", action="store_true", help="print a JSON summary instead")
    settings.add_flags(parser, (), names=SETTINGS_USED)
    parser.set_defaults(handler=run)


def _positive(name: str, value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{name} must be a positive number of seconds, got {value:g}")
    return value


def _daemon_address(s: settings.Settings) -> str:
    from cuzk_supervisor.lifecycle import assemble  # only without --addr

    return assemble.daemon_listen(s)


def run(args: argparse.Namespace) -> int:
    # Validate everything before connecting: bad input never starts anything.
    loaded = settings.from_namespace(args)
    s = loaded.settings
    if args.count < 1:
        raise UsageError(f"--count must be >= 1, got {args.count}")
    if args.concurrency < 1:
        raise UsageError(f"--concurrency must be >= 1, got {args.concurrency}")
    ready_deadline = _positive("--ready-deadline-s", args.ready_deadline_s)
    # The deadlines run uses for its own proofs (each one checked when the settings loaded).
    timeouts = ProvingTimeouts(
        submit_deadline_s=s.submit_deadline_s,
        await_deadline_s=s.await_deadline_s,
        proof_budget_s=s.proof_budget_s,
    )
    address = parse_address(args.addr if args.addr is not None else _daemon_address(s))
    c1_proof_kind(args.kind)  # checked before reading ~51 MB
    template = build_submit_request(load_c1(s.c1_file), args.kind)

    live = progress.LiveLine(sys.stderr) if sys.stderr.isatty() and s.log_format != "json" else None
    level = s.log_level
    if loaded.sources["log_level"] == "default":
        level = "warning" if live is not None else "info"
    configure_logging(
        level,
        json={"auto": None, "json": True, "console": False}[s.log_format],
        extra_processors=[live.processor] if live is not None else [],
    )
    try:
        return asyncio.run(
            _prove(
                address,
                timeouts,
                template,
                count=args.count,
                concurrency=args.concurrency,
                ready_deadline=ready_deadline,
                as_json=args.json,
                live=live,
                status_listen=s.daemon_status_listen,
            )
        )
    finally:
        if live is not None:
            live.clear()


async def _ticking(work: Awaitable[T], ticker: progress.Ticker) -> T:
    """Await ``work`` with ``ticker`` reporting beside it."""
    ticker.draw()
    task = asyncio.create_task(ticker.run())
    try:
        return await work
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _prove(
    address: Address,
    timeouts: ProvingTimeouts,
    template: pb.SubmitProofRequest,
    *,
    count: int,
    concurrency: int,
    ready_deadline: float,
    as_json: bool,
    live: progress.LiveLine | None,
    status_listen: str,
) -> int:
    log.info(
        progress.EVENT_STARTED,
        address=str(address),
        count=count,
        concurrency=concurrency,
        input_bytes=template.ByteSize(),
        ready_deadline_s=ready_deadline,
        proof_budget_s=timeouts.proof_budget_s,
    )
    async with ProvingClient(address, timeouts) as client:
        asked = time.monotonic()
        waiting = progress.Ticker(
            progress.EVENT_WAITING,
            lambda: progress.waiting_fields(
                address=str(address),
                waited_s=time.monotonic() - asked,
                deadline_s=ready_deadline,
            ),
            progress.waiting_text,
            live=live,
        )
        try:
            await _ticking(client.wait_ready(ready_deadline), waiting)
        except DaemonNotReady as exc:
            if live is not None:
                live.clear()
            print(f"cuzk-supervisor prove: error: {exc}", file=sys.stderr, flush=True)
            return exitcodes.DAEMON_FAILED_TO_START

        tracker = progress.Tracker(client)
        started = time.monotonic()
        partitions: dict[str, tuple[int, int]] = {}

        async def read_partitions() -> None:
            nonlocal partitions
            if tracker.running:
                partitions = await asyncio.to_thread(progress.read_partitions, status_listen)

        ticker = progress.Ticker(
            progress.EVENT_PROGRESS,
            lambda: progress.progress_fields(
                now=time.monotonic(),
                started=started,
                count=count,
                tracker=tracker,
                partitions=partitions,
            ),
            progress.progress_text,
            live=live,
            refresh=read_partitions,
        )

        def on_result(index: int, result: ProofResult) -> None:
            if as_json:
                return
            if live is not None:
                live.clear()
            print(report.proof_line(index, count, result), flush=True)

        batch = await _ticking(
            run_batch(tracker, template, count, concurrency, on_result=on_result), ticker
        )

    if live is not None:
        live.clear()
    measured = report.daemon_time(batch.results, batch.summary.wall_s)
    log.info(progress.EVENT_SUMMARY, address=str(address), **report.summary_fields(batch, measured))
    if as_json:
        document: dict[str, Any] = report.summary_document(str(address), batch, measured)
        print(json.dumps(document), flush=True)
    else:
        print(report.summary_line(batch, measured), flush=True)
    return exitcodes.OK if batch.summary.failed == 0 else exitcodes.FAILURE
