"""C1 envelopes: generated at the asked size, and checked the way the daemon checks them."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

from cuzk_supervisor.sim.daemon.c1 import SECTOR_SIZE_32G, check_c1, make_c1


def test_envelope_shape_and_size() -> None:
    data = make_c1(2_000_000, sector_num=7)
    assert abs(len(data) - 2_000_000) < 2_000
    envelope = json.loads(data)
    assert envelope["SectorNum"] == 7
    assert envelope["SectorSize"] == SECTOR_SIZE_32G
    assert isinstance(json.loads(base64.b64decode(envelope["Phase1Out"])), dict)
    assert check_c1(data) is None


def test_bad_inputs_say_why() -> None:
    assert "not JSON" in (check_c1(b"\x00garbage") or "")
    assert "Phase1Out" in (check_c1(b'{"SectorNum": 1}') or "")
    assert "base64" in (check_c1(b'{"Phase1Out": "!!!"}') or "")
    not_object = base64.b64encode(b"[1, 2]").decode()
    assert "JSON object" in (check_c1(json.dumps({"Phase1Out": not_object}).encode()) or "")
    # The envelope's failures are worded as the real daemon's.
    wrapper = "C1 parse failed: failed to parse C1 output wrapper JSON"
    assert (check_c1(b"junk") or "").startswith(wrapper)
    assert (check_c1(b'{"SectorNum": 1}') or "").startswith(wrapper)


def test_command_line_writes_a_file(tmp_path: Path) -> None:
    out = tmp_path / "c1.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "cuzk_supervisor.sim.daemon.c1",
            "--out",
            str(out),
            "--size-mb",
            "1",
            "--sector-num",
            "3",
        ],
        check=True,
        capture_output=True,
    )
    data = out.read_bytes()
    assert abs(len(data) - 1_000_000) < 2_000
    assert json.loads(data)["SectorNum"] == 3
    assert check_c1(data) is None
