"""``cuzk-supervisor prove``: one proof or a small batch against any daemon (real or simulated).

Replaces cuzk-bench's ``single`` and ``batch`` without their one long ``Prove`` call: each proof
is a submit and then short awaits (see ``cuzk_supervisor.adapters.proving``). Everything is checked
before
anything connects; bad input is a one-line error and exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from typing import Any

from cuzk_supervisor import exitcodes
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
from cuzk_supervisor.adapters.provingresults import BatchResult, ProofResult
from cuzk_supervisor.address import Address, parse_address
from cuzk_supervisor.cli.observe import configure_logging
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.proto import proving_pb2 as pb

_DEFAULTS = ProvingTimeouts()
DEFAULT_READY_DEADLINE_S = 30.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "prove",
        help="run one proof or a small batch against a daemon and report the rate",
        description=(
            "Submit proofs to a cuzk daemon (real or simulated) and await them with short "
            "deadlines. Prints one line per proof as it finishes and a summary (proofs per "
            "hour = completed / wall time from the first submit to the last end x 3600). "
            "Exit 0 if every proof completed, 1 if any failed, 2 on bad input."
        ),
    )
    parser.add_argument("--addr", required=True, help="daemon address: ip:port or unix:///path")
    parser.add_argument("--c1", required=True, help="C1 input file (JSON envelope, ~51 MB)")
    parser.add_argument("--count", type=int, default=1, help="proofs to run (default 1)")
    parser.add_argument(
        "--concurrency", type=int, default=1, help="proofs in flight at once (default 1)"
    )
    parser.add_argument(
        "--kind", default="porep", help=f"proof kind: {', '.join(PROOF_KINDS)} (default porep)"
    )
    parser.add_argument(
        "--await-deadline",
        type=float,
        default=_DEFAULTS.await_deadline_s,
        metavar="S",
        help=f"deadline of each AwaitProof call (default {_DEFAULTS.await_deadline_s:g} s)",
    )
    parser.add_argument(
        "--submit-deadline",
        type=float,
        default=_DEFAULTS.submit_deadline_s,
        metavar="S",
        help=f"deadline of each SubmitProof call (default {_DEFAULTS.submit_deadline_s:g} s)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=_DEFAULTS.proof_budget_s,
        metavar="S",
        help=f"total time allowed per proof (default {_DEFAULTS.proof_budget_s:g} s)",
    )
    parser.add_argument(
        "--ready-deadline",
        type=float,
        default=DEFAULT_READY_DEADLINE_S,
        metavar="S",
        help="how long to wait for the daemon to answer GetStatus before proving "
        f"(default {DEFAULT_READY_DEADLINE_S:g} s)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary instead")
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=("debug", "info", "warning", "error"),
        help="structured log level on stderr (default warning; info shows every retry)",
    )
    parser.set_defaults(handler=run)


def _positive(name: str, value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{name} must be a positive number of seconds, got {value:g}")
    return value


def run(args: argparse.Namespace) -> int:
    # Validate everything before connecting: bad input never starts anything.
    if args.count < 1:
        raise UsageError(f"--count must be >= 1, got {args.count}")
    if args.concurrency < 1:
        raise UsageError(f"--concurrency must be >= 1, got {args.concurrency}")
    try:
        timeouts = ProvingTimeouts(
            submit_deadline_s=_positive("--submit-deadline", args.submit_deadline),
            await_deadline_s=_positive("--await-deadline", args.await_deadline),
            proof_budget_s=_positive("--budget", args.budget),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    ready_deadline = _positive("--ready-deadline", args.ready_deadline)
    address = parse_address(args.addr)
    c1_proof_kind(args.kind)  # checked before reading ~51 MB
    template = build_submit_request(load_c1(args.c1), args.kind)

    configure_logging(args.log_level)
    return asyncio.run(
        _prove(
            address,
            timeouts,
            template,
            count=args.count,
            concurrency=args.concurrency,
            ready_deadline=ready_deadline,
            as_json=args.json,
        )
    )


def _proof_line(index: int, count: int, result: ProofResult) -> str:
    line = (
        f"proof {index + 1}/{count} {result.job_id} "
        f"{'ok' if result.ok else 'failed'} "
        f"wall {result.wall_s:.1f} s daemon {result.timings.total_ms} ms"
    )
    line += f" submissions {result.submissions}"
    if result.uploads_cut:
        line += f" uploads_cut {result.uploads_cut}"
    if not result.ok:
        line += f" error: {result.error}"
    return line


def _totals(batch: BatchResult) -> dict[str, int]:
    """``submissions``: SubmitProof calls the daemon saw (its own count agrees);
    ``uploads_cut``: submits cut before they landed (then found NOT_FOUND), counted apart."""
    return {
        "submissions": sum(r.submissions for r in batch.results),
        "uploads_cut": sum(r.uploads_cut for r in batch.results),
    }


def _summary_line(batch: BatchResult) -> str:
    s = batch.summary
    totals = _totals(batch)
    return (
        f"summary: {s.completed} completed, {s.failed} failed, wall {s.wall_s:.1f} s, "
        f"{s.proofs_per_hour:.2f} proofs/hour (count {s.count}, concurrency {s.concurrency}, "
        f"submissions {totals['submissions']}, uploads cut {totals['uploads_cut']})"
    )


async def _prove(
    address: Address,
    timeouts: ProvingTimeouts,
    template: pb.SubmitProofRequest,
    *,
    count: int,
    concurrency: int,
    ready_deadline: float,
    as_json: bool,
) -> int:
    def on_result(index: int, result: ProofResult) -> None:
        if not as_json:
            print(_proof_line(index, count, result), flush=True)

    async with ProvingClient(address, timeouts) as client:
        try:
            await client.wait_ready(ready_deadline)
        except DaemonNotReady as exc:
            print(f"cuzk-supervisor prove: error: {exc}", file=sys.stderr)
            return exitcodes.FAILURE
        batch = await run_batch(client, template, count, concurrency, on_result=on_result)

    if as_json:
        document: dict[str, Any] = {
            "address": str(address),
            **batch.summary.to_dict(),
            **_totals(batch),
            "proofs": [r.to_dict() for r in batch.results],
        }
        print(json.dumps(document), flush=True)
    else:
        print(_summary_line(batch), flush=True)
    return exitcodes.OK if batch.summary.failed == 0 else exitcodes.FAILURE
