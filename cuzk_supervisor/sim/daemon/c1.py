"""C1 envelopes: the PoRep input the daemon takes as ``vanilla_proof``.

Shape (as a benchmark ``c1.json``): ``{"SectorNum": int, "Phase1Out": "<base64 of the C1
output JSON>", "SectorSize": 34359738368}``, about 51 MB for a 32 GiB sector. ``make_c1``
writes one of any size with filler inside Phase1Out; ``check_c1`` is what the simulated daemon
accepts.

    python -m cuzk_supervisor.sim.daemon.c1 --out c1.json [--size-mb 51] [--sector-num N]
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

SECTOR_SIZE_32G = 34359738368
MB = 10**6


def make_c1(size_bytes: int = 51 * MB, sector_num: int = 1) -> bytes:
    """A valid envelope of about ``size_bytes`` bytes (never less than a few hundred)."""
    phase1 = {
        "registered_proof": "StackedDrg32GiBV1_1",
        "comm_r": [0] * 32,
        "comm_d": [0] * 32,
        "replica_id": [0] * 32,
        "seed": [0] * 32,
        "ticket": [0] * 32,
        "vanilla_proofs": {"StackedDrg32GiBV1": []},
        "filler": "",
    }
    # base64 grows the inner JSON by 4/3; the outer fields add a fixed few dozen bytes.
    skeleton = len(json.dumps(phase1)) * 4 // 3 + 100
    filler_len = max(0, (size_bytes - skeleton) * 3 // 4)
    phase1["filler"] = os.urandom((filler_len + 1) // 2).hex()[:filler_len]
    inner = json.dumps(phase1, separators=(",", ":")).encode()
    envelope = {
        "SectorNum": sector_num,
        "Phase1Out": base64.b64encode(inner).decode("ascii"),
        "SectorSize": SECTOR_SIZE_32G,
    }
    return json.dumps(envelope, separators=(",", ":")).encode()


def write_c1(path: Path, size_bytes: int = 51 * MB, sector_num: int = 1) -> int:
    """Write an envelope to ``path`` (atomically); returns its size."""
    data = make_c1(size_bytes, sector_num)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return len(data)


# The real daemon's text for an input whose envelope does not parse.
WRAPPER_PARSE_FAILED = "C1 parse failed: failed to parse C1 output wrapper JSON"


def check_c1(payload: bytes) -> str | None:
    """None if ``payload`` is an envelope the daemon can prove, else why not (the envelope's
    failures worded as the real daemon words them; the inner ones with the same prefix)."""
    try:
        envelope = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        return f"{WRAPPER_PARSE_FAILED}: not JSON ({exc})"
    if not isinstance(envelope, dict) or not isinstance(envelope.get("Phase1Out"), str):
        return f"{WRAPPER_PARSE_FAILED}: missing field `Phase1Out`"
    try:
        inner = json.loads(base64.b64decode(envelope["Phase1Out"], validate=True))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return "C1 parse failed: `Phase1Out` is not base64 of a JSON object"
    if not isinstance(inner, dict):
        return "C1 parse failed: `Phase1Out` is not base64 of a JSON object"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cuzk_supervisor.sim.daemon.c1",
        description="Write a C1 envelope for the simulator.",
    )
    parser.add_argument("--out", type=Path, required=True, help="file to write")
    parser.add_argument("--size-mb", type=float, default=51.0, help="about this many MB")
    parser.add_argument("--sector-num", type=int, default=1)
    args = parser.parse_args(argv)
    size = write_c1(args.out, int(args.size_mb * MB), args.sector_num)
    print(f"wrote {args.out} ({size} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
