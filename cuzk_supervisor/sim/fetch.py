"""A stand-in for the parameter download: writes files at a set rate, printing as it goes.

``python -m cuzk_supervisor.sim.fetch --rate-mb 40 NAME:BYTES [NAME:BYTES ...]`` writes each file in
the current folder, so the params phase has real bytes on disk to measure progress from.
``--chatter N`` prints N progress lines a second besides (a fetch that prints a line per block).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

CHUNK = 1 << 20


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cuzk_supervisor.sim.fetch", description=__doc__
    )
    parser.add_argument("--rate-mb", type=float, default=40.0, help="MB per second")
    parser.add_argument("--fail", action="store_true", help="exit 1 halfway (a broken download)")
    parser.add_argument(
        "--chatter", type=float, default=0.0, metavar="N", help="progress lines a second"
    )
    parser.add_argument("files", nargs="+", metavar="NAME:BYTES")
    args = parser.parse_args(argv)
    started = time.monotonic()
    written = 0
    total = sum(int(spec.rpartition(":")[2]) for spec in args.files)
    chatted = 0
    for spec in args.files:
        name, _, size_text = spec.rpartition(":")
        size = int(size_text)
        print(f"fetching {name} ({size} bytes)", flush=True)
        with Path(name).open("wb") as out:
            left = size
            while left:
                if args.fail and written >= total // 2:
                    print(f"error: connection reset while fetching {name}", flush=True)
                    return 1
                n = min(CHUNK, left)
                out.write(b"\0" * n)
                out.flush()
                left -= n
                written += n
                due = int(args.chatter * (time.monotonic() - started)) - chatted
                if due > 0:
                    line = f"  {name}: {written} of {total} bytes"
                    sys.stdout.write("".join(f"{line} (line {chatted + k})\n" for k in range(due)))
                    sys.stdout.flush()
                    chatted += due
                # Pace the writes: the bytes on disk grow at the chosen rate.
                ahead = written / (args.rate_mb * 1e6) - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
    print(f"fetched {len(args.files)} files, {written} bytes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
