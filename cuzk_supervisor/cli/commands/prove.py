"""``cuzk-supervisor prove``: one proof or a small batch against any daemon (real or simulated).

Replaces cuzk-bench's ``single`` and ``batch`` without their one long ``Prove`` call: each proof
is a submit and then short awaits (``cuzk_supervisor.adapters.proving.client``). Everything is
checked before anything connects. While it waits it says so (``proveprogress``); at the end it
reports proofs per hour in wall time and in the daemon's own time (``provereport``). On a
terminal it shows the terminal view (``cuzk_supervisor.cli.viewprove``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import sys
import time
import tomllib
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from cuzk_supervisor import exitcodes, settings
from cuzk_supervisor.cli import observe
from cuzk_supervisor.cli.view import ViewOptions
from cuzk_supervisor.errors import UsageError

# The proving client, the C1 reader and what they report load gRPC and protobuf: imported by
# the functions that use them, so ``prove --help`` loads neither.
if TYPE_CHECKING:
    from cuzk_supervisor.adapters.proving.policy import ProvingTimeouts
    from cuzk_supervisor.adapters.proving.results import ProofResult
    from cuzk_supervisor.address import Address
    from cuzk_supervisor.cli.commands import proveprogress as progress
    from cuzk_supervisor.proto import proving_pb2 as pb

T = TypeVar("T")
DEFAULT_READY_DEADLINE_S = 30.0
# The help text's figures, so that ``prove --help`` imports no proto module (tests check them
# against ``proofinput.PROOF_KINDS`` and ``proveprogress.PROGRESS_INTERVAL_S``).
HELP_PROOF_KINDS = ("porep", "snap", "wpost", "winning")
HELP_PROGRESS_INTERVAL_S = 5.0

SETTINGS_USED = (
    "c1_file",
    "submit_deadline_s",
    "await_deadline_s",
    "proof_budget_s",
    "log_level",
    "log_format",
)
"""The settings ``prove`` has flags for; every other one is read and checked as every command
does (``daemon_listen``, ``run_dir`` and ``daemon_status_listen`` are used)."""

DESCRIPTION = """\
Submit proofs to a cuzk daemon (real or simulated) and await them with short deadlines. Prints
one line per proof as it ends and a summary: proofs per hour (completed / wall time from the
first submit to the last end x 3600), and the same in the daemon's own time (its total_ms
against the wall time: the simulator's clock runs --time-scale times faster).

The C1 file and the deadlines are the settings run uses for its proofs (a first proof after a
daemon start builds the PCE: give it --proof-budget-s 3600). Without --addr it asks the daemon
run starts (daemon_listen, else cuzk.sock in run_dir).

While it waits for the daemon and while proofs run, it says so every {interval} s: a
prove.waiting or prove.progress event (JSON lines on stderr, from log_level up). On a terminal
(log_format auto) it shows a person's view instead: a live line (the proof running, its elapsed
time, its partitions done when the daemon's HTTP status lists them), a line per proof as it
ends, warnings and errors, and a closing summary with both rates; --verbose shows every other
event too. log_format console shows every event in colour; json the JSON lines.

Exit 0 if every proof completed, 1 if any failed, 2 on bad input, 3 if no daemon answers at the
address within --ready-deadline-s.
"""

log = structlog.get_logger("cuzk_supervisor.prove")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "prove",
        help="run one proof or a small batch against a daemon and report the rate",
        description=DESCRIPTION.format(interval=f"{HELP_PROGRESS_INTERVAL_S:g}"),
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
        help=f"proof kind: {', '.join(HELP_PROOF_KINDS)} (default: porep)",
    )
    own.add_argument(
        "--ready-deadline-s",
        type=float,
        default=DEFAULT_READY_DEADLINE_S,
        metavar="SECONDS",
        help="how long to wait for the daemon to answer GetStatus before proving; then exit 3 "
        f"(default: {DEFAULT_READY_DEADLINE_S:g})",
    )
    own.add_argument(
        "--partition-workers",
        type=int,
        default=None,
        metavar="N",
        help="the daemon's partition workers, for the verdict on what bounds the rate (default: "
        "from --daemon-config)",
    )
    own.add_argument(
        "--daemon-config",
        type=Path,
        default=None,
        metavar="PATH",
        help="the daemon's config file, read for its partition workers (default: the one run "
        "renders, cuzk.toml in run_dir)",
    )
    own.add_argument("--json", action="store_true", help="print a JSON summary instead")
    settings.add_flags(parser, (), names=SETTINGS_USED)
    observe.add_view_flags(parser)
    parser.set_defaults(handler=run)


def _positive(name: str, value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{name} must be a positive number of seconds, got {value:g}")
    return value


def _partition_workers(args: argparse.Namespace, s: settings.Settings) -> tuple[int | None, str]:
    """The partition workers the verdict is read against, and where they came from."""
    if args.partition_workers is not None:
        return args.partition_workers, "--partition-workers"
    from cuzk_supervisor.cli.commands.provereport import config_workers

    path = args.daemon_config or s.run_dir / "cuzk.toml"
    try:
        document = tomllib.loads(path.read_text())
    except FileNotFoundError:
        if args.daemon_config is not None:
            raise UsageError(f"--daemon-config {path}: no such file") from None
        return None, f"not told (no {path}; --partition-workers N)"
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"daemon config {path}: {exc}") from None
    workers = config_workers(document)
    if workers is None:
        return None, f"not told ({path} names none; --partition-workers N)"
    return workers, str(path)


def run(args: argparse.Namespace) -> int:
    # Here, not at the top (gRPC, protobuf).
    from cuzk_supervisor.adapters.proving.policy import ProvingTimeouts
    from cuzk_supervisor.adapters.proving.proofinput import (
        build_submit_request,
        c1_proof_kind,
        load_c1,
    )
    from cuzk_supervisor.address import parse_address
    from cuzk_supervisor.settings.policies import daemon_listen

    s = settings.from_namespace(args).settings  # everything is checked before connecting
    counts = (("--count", args.count), ("--concurrency", args.concurrency))
    for flag, value in (*counts, ("--partition-workers", args.partition_workers)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    workers = _partition_workers(args, s)
    ready_deadline = _positive("--ready-deadline-s", args.ready_deadline_s)
    timeouts = ProvingTimeouts(
        submit_deadline_s=s.submit_deadline_s,
        await_deadline_s=s.await_deadline_s,
        proof_budget_s=s.proof_budget_s,
    )
    address = parse_address(args.addr if args.addr is not None else daemon_listen(s))
    c1_proof_kind(args.kind)  # checked before reading ~51 MB
    template = build_submit_request(load_c1(s.c1_file), args.kind)

    observe.configure_logging(
        s.log_level,
        json={"auto": None, "json": True, "console": False}[s.log_format],
        view=observe.TerminalView(ViewOptions(command="prove", verbose=args.verbose)),
    )
    # The plain lines only where stdout is not the view's terminal (a file, a pipe) or no view.
    plain = not (observe.view_active() and sys.stdout.isatty())
    try:
        code = asyncio.run(
            _prove(
                address,
                timeouts,
                template,
                s,
                count=args.count,
                concurrency=args.concurrency,
                ready_deadline=ready_deadline,
                as_json=args.json,
                plain=plain,
                workers=workers,
            )
        )
    except KeyboardInterrupt:  # the view's last line says so; main gives the exit code
        observe.finish_view(exitcodes.SIGNAL_BASE + signal.SIGINT)
        raise
    return observe.finish_view(code)


async def _ticking(work: Awaitable[T], ticker: progress.Ticker) -> T:
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
    s: settings.Settings,
    *,
    count: int,
    concurrency: int,
    ready_deadline: float,
    as_json: bool,
    plain: bool,
    workers: tuple[int | None, str],
) -> int:
    from cuzk_supervisor.adapters.machine.gpu import no_gpu_activity
    from cuzk_supervisor.adapters.machine.gpunvml import NvmlProbe
    from cuzk_supervisor.adapters.proving.batch import run_batch
    from cuzk_supervisor.adapters.proving.client import ProvingClient
    from cuzk_supervisor.adapters.proving.daemonstatus import read_sample, status_address
    from cuzk_supervisor.adapters.proving.errors import DaemonNotReady
    from cuzk_supervisor.adapters.proving.statussampler import StatusSampler, sampler_on
    from cuzk_supervisor.cli.commands import proveprogress as progress
    from cuzk_supervisor.cli.commands import provereport as report

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
                address=str(address), waited_s=time.monotonic() - asked, deadline_s=ready_deadline
            ),
        )
        try:
            await _ticking(client.wait_ready(ready_deadline), waiting)
        except DaemonNotReady as exc:
            observe.say_error("prove", str(exc))
            return exitcodes.DAEMON_FAILED_TO_START

        tracker = progress.Tracker(client)
        started = time.monotonic()
        partitions: dict[str, tuple[int, int]] = {}

        status_at = status_address(s.daemon_status_listen)

        async def read_partitions() -> None:
            nonlocal partitions
            if tracker.running:
                sample = await read_sample(status_at, time.monotonic())
                partitions = sample.partitions_by_job() if sample is not None else {}

        ticker = progress.Ticker(
            progress.EVENT_PROGRESS,
            lambda: progress.progress_fields(
                now=time.monotonic(),
                started=started,
                count=count,
                tracker=tracker,
                partitions=partitions,
            ),
            refresh=read_partitions,
        )

        def on_result(index: int, result: ProofResult) -> None:
            if as_json or not plain:
                return
            print(report.proof_line(index, count, result), flush=True)

        # The daemon's status sampled over the batch, as the bench samples it, to judge what
        # bounds the rate; with gpu_probe nvml each sample also carries NVML's utilisation.
        listen, sample_s = s.daemon_status_listen, s.bench_status_sample_s
        gpu = NvmlProbe() if s.gpu_probe == "nvml" and sampler_on(listen, sample_s) else None
        sampler = StatusSampler(
            listen, sample_s, gpus=gpu.activity if gpu is not None else no_gpu_activity
        )
        try:
            async with sampler.sampling() as samples:
                batch = await _ticking(
                    run_batch(tracker, template, count, concurrency, on_result=on_result), ticker
                )
        finally:
            if gpu is not None:
                gpu.shutdown()
        window = (started, time.monotonic())

    measured = report.daemon_time(batch.results, batch.summary.wall_s)
    verdict = None
    if sampler.enabled:
        rate = measured.proofs_per_hour if measured is not None else None
        verdict = report.bound(samples, concurrency, window, *workers, rate)
    fields = report.summary_fields(batch, measured, verdict)
    log.info(progress.EVENT_SUMMARY, address=str(address), **fields)
    if as_json:
        document: dict[str, Any] = report.summary_document(str(address), batch, measured, verdict)
        print(json.dumps(document), flush=True)
    elif plain:
        print(report.summary_line(batch, measured), flush=True)
        if verdict is not None and verdict.evidence.samples:  # a status listener answered
            print(f"bound: {verdict.line()}", flush=True)
    return exitcodes.OK if batch.summary.failed == 0 else exitcodes.FAILURE
