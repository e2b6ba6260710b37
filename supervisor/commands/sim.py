"""``cuzk-supervisor sim``: the demo on a laptop, no GPU.

Starts the simulated daemon as a supervised child (rendered config, own process group, output
carried to a log file), waits until it answers, runs a warmup proof (it builds the PCE cache)
and a batch, and prints the measured rate beside the simulator's true steady-state rate.
The full lifecycle (register, params, warmup, restart, settle, bench, report, run) replaces this
body when it lands; the command line stays.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import re
import sys
from pathlib import Path

from supervisor import exitcodes
from supervisor.address import free_loopback_port, parse_address
from supervisor.daemon import DaemonProcess, DaemonSettings
from supervisor.daemon_config import DaemonConfigValues
from supervisor.errors import UsageError
from supervisor.observe import configure_logging
from supervisor.policy import RestartPolicy
from supervisor.proofinput import build_submit_request, load_c1
from supervisor.proto import proving_pb2 as pb
from supervisor.proving import ProvingClient, ProvingTimeouts, run_batch
from supervisor.runtime import Runtime, run_supervised
from supervisor.sim.c1 import write_c1
from supervisor.supervision import DaemonKeeper

_STEADY_RATE = re.compile(r"^cuzk_sim_steady_state_proofs_per_hour\s+([0-9.eE+-]+)$", re.M)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "sim",
        help="run the simulated daemon and a proof batch against it (no GPU needed)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=Path("run/sim"),
        help="folder for the config, socket, logs, params and C1 (default run/sim)",
    )
    parser.add_argument("--workers", type=int, default=2, help="partition_workers (default 2)")
    parser.add_argument("--count", type=int, default=6, help="proofs in the batch (default 6)")
    parser.add_argument("--concurrency", type=int, default=2, help="proofs in flight (default 2)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=100.0,
        help="simulated seconds per real second (default 100)",
    )
    parser.add_argument("--c1-mb", type=int, default=51, help="size of the C1 input in MB")
    parser.add_argument("--log-level", default="info", help="supervisor log level")
    parser.set_defaults(handler=main)


def _validate(args: argparse.Namespace) -> None:
    for name in ("workers", "count", "concurrency", "c1_mb"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1")
    if args.time_scale <= 0:
        raise UsageError("--time-scale must be > 0")


def main(args: argparse.Namespace) -> int:
    _validate(args)
    configure_logging(args.log_level)
    run_dir: Path = args.run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    c1_path = run_dir / "c1.json"
    if not c1_path.exists() or c1_path.stat().st_size < args.c1_mb * 1_000_000 * 0.9:
        write_c1(c1_path, size_bytes=args.c1_mb * 1_000_000)
    settings = DaemonSettings(
        binary=sys.executable,
        extra_args=("-m", "supervisor.sim.daemon", "--time-scale", f"{args.time_scale:g}"),
        config_path=run_dir / "cuzk.toml",
        log_path=run_dir / "cuzk.log",
        startup_deadline_s=60.0,
        stop_grace_s=5.0,
    )
    values = DaemonConfigValues(
        partition_workers=args.workers,
        total_budget_gib=69 + 20 * args.workers,
        max_parallel_synthesis=args.workers,
        listen=f"unix://{run_dir / 'cuzk.sock'}",
        status_listen=f"127.0.0.1:{free_loopback_port()}",
        param_cache=str(run_dir / "params"),
    )
    request = build_submit_request(load_c1(c1_path))
    return run_supervised(lambda rt: _demo(rt, settings, values, request, args))


async def _demo(
    rt: Runtime,
    settings: DaemonSettings,
    values: DaemonConfigValues,
    request: pb.SubmitProofRequest,
    args: argparse.Namespace,
) -> int:
    keeper = DaemonKeeper(
        settings,
        values,
        RestartPolicy(),
        process_factory=functools.partial(DaemonProcess, spawn=rt.reaper.spawn),
    )
    keeper_task = asyncio.create_task(keeper.run())
    ready = asyncio.create_task(keeper.wait_ready())
    await asyncio.wait({keeper_task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if keeper_task.done():
        outcome = keeper_task.result()
        print(f"daemon did not start: {outcome.reason}", file=sys.stderr)
        return outcome.exit_code
    timeouts = ProvingTimeouts(await_deadline_s=1.0)
    try:
        async with ProvingClient(parse_address(values.listen), timeouts) as client:
            print("warmup: first proof (no PCE cache yet, so slow) ...", flush=True)
            warm = await client.prove(request)
            print(f"warmup: {'ok' if warm.ok else 'FAILED ' + warm.error} in {warm.wall_s:.2f} s")
            if not warm.ok:
                return exitcodes.FAILURE
            print(f"batch: {args.count} proofs at concurrency {args.concurrency} ...", flush=True)
            batch = await run_batch(client, request, args.count, args.concurrency)
            metrics = await client.metrics()
    finally:
        await keeper.stop()
        await keeper_task
    s = batch.summary
    match = _STEADY_RATE.search(metrics)
    true_rate = float(match.group(1)) if match else float("nan")
    # The simulator's clock runs time_scale times faster than the wall clock.
    measured = s.proofs_per_hour / args.time_scale
    print(f"completed {s.completed}/{s.count}, failed {s.failed}, wall {s.wall_s:.2f} s")
    print(
        f"measured rate {measured:.2f} proofs/hour in simulated time "
        f"(the simulator's steady-state rate: {true_rate:.2f}; "
        f"error {100 * (measured - true_rate) / true_rate:+.2f}%)"
    )
    return exitcodes.OK if s.failed == 0 else exitcodes.FAILURE
