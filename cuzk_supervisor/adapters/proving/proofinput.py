"""Proof inputs: loading a C1 file and building ``SubmitProofRequest``s; proof kind names.

A C1 file is the JSON envelope the daemon takes as a PoRep ``vanilla_proof``:
``{"SectorNum": int, "Phase1Out": "<base64 of the C1 output JSON>", "SectorSize": 34359738368}``
(about 51 MB for a 32 GiB sector). The file's bytes are sent as they are, as ``cuzk-bench``
does; it is parsed only to check it, so a bad file is a one-line UsageError before anything
connects. Its size is checked (``stat``, before reading) against the daemon's 128 MiB message
limit, so a huge or sparse file is refused at once.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cuzk_supervisor.adapters.inputfile import read_bytes
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.proto import proving_pb2 as pb

SECTOR_SIZE_32GIB = 32 * 1024**3
# Filecoin's PoRep sector sizes: 2 KiB, 8 MiB, 512 MiB (test networks), 32 GiB and 64 GiB.
SECTOR_SIZES = (2 << 10, 8 << 20, 512 << 20, SECTOR_SIZE_32GIB, 64 << 30)
# The daemon's gRPC server takes messages of at most 128 MiB (docs/daemon.md); the C1 bytes travel
# as the request's vanilla_proof, so the file must leave room for the request's other fields.
DAEMON_MESSAGE_LIMIT_BYTES = 128 << 20
C1_MAX_BYTES = DAEMON_MESSAGE_LIMIT_BYTES - (64 << 10)
_UINT64_MAX = (1 << 64) - 1
# cuzk-bench's default miner id; the benchmark C1 files were produced for it.
DEFAULT_MINER_ID = 1000

PROOF_KINDS: Mapping[str, pb.ProofKind] = {
    "porep": pb.POREP_SEAL_COMMIT,
    "snap": pb.SNAP_DEALS_UPDATE,
    "wpost": pb.WINDOW_POST_PARTITION,
    "winning": pb.WINNING_POST,
}
"""Canonical proof kind names (the ones cuzk-bench takes) → ``ProofKind``."""

_ALIASES: Mapping[str, str] = {
    "porep-c2": "porep",
    "seal-commit": "porep",
    "snap-deals": "snap",
    "update": "snap",
    "window-post": "wpost",
    "windowpost": "wpost",
    "winning-post": "winning",
    "winningpost": "winning",
}


def parse_proof_kind(name: str) -> pb.ProofKind:
    """``porep`` → POREP_SEAL_COMMIT etc. (cuzk-bench's aliases too); UsageError otherwise."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in PROOF_KINDS:
        raise UsageError(f"unknown proof kind {name!r}: use one of {', '.join(PROOF_KINDS)}")
    return PROOF_KINDS[key]


def c1_proof_kind(name: str) -> pb.ProofKind:
    """The proof kind for a C1 input: only PoRep takes one; other kinds need vanilla proofs
    this tool does not build, so they are a UsageError."""
    kind = parse_proof_kind(name)
    if kind != pb.POREP_SEAL_COMMIT:
        raise UsageError(
            f"proof kind {name!r} needs vanilla proofs, not a C1 file: only porep is supported here"
        )
    return kind


@dataclass(frozen=True, slots=True)
class C1Input:
    """A checked C1 file: its raw bytes (sent as ``vanilla_proof``) and the envelope's numbers."""

    path: Path
    sector_number: int
    sector_size: int
    data: bytes = field(repr=False)

    @property
    def size_bytes(self) -> int:
        return len(self.data)


def _uint_field(envelope: Mapping[str, object], key: str, default: int, path: Path) -> int:
    value = envelope.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _UINT64_MAX:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "…"
        raise UsageError(f"C1 file {path}: {key} must be a non-negative integer, got {shown}")
    return value


def load_c1(path: Path | str) -> C1Input:
    """Read and check a C1 file; every problem is a one-line UsageError naming the file."""
    path = Path(path)
    data = read_bytes(
        path,
        what="C1 file",
        max_bytes=C1_MAX_BYTES,
        limit_why="the daemon takes messages of at most 128 MiB, the request's other fields "
        "included",
    )
    if not data.strip():
        raise UsageError(f"C1 file {path} is empty")
    try:
        envelope = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, a 5000-digit number
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"C1 file {path} is not JSON: {reason[:200]}") from None
    if not isinstance(envelope, dict):
        raise UsageError(
            f"C1 file {path} is not a JSON object (got {type(envelope).__name__}); expected "
            '{"SectorNum": ..., "Phase1Out": "<base64>", "SectorSize": ...}'
        )
    phase1 = envelope.get("Phase1Out")
    if not isinstance(phase1, str) or not phase1:
        raise UsageError(
            f"C1 file {path} has no Phase1Out (a non-empty base64 string of the C1 output)"
        )
    try:
        inner = base64.b64decode(phase1, validate=True)
    except (binascii.Error, ValueError):
        raise UsageError(f"C1 file {path}: Phase1Out is not valid base64") from None
    try:  # the daemon parses it as the C1 output, a JSON object
        output = json.loads(inner.decode("utf-8"))
    except (ValueError, RecursionError):
        output = None
    if not isinstance(output, dict):
        raise UsageError(
            f"C1 file {path}: Phase1Out is not base64 of a JSON object (the C1 output)"
        )
    sector_size = _uint_field(envelope, "SectorSize", SECTOR_SIZE_32GIB, path)
    if sector_size not in SECTOR_SIZES:
        raise UsageError(
            f"C1 file {path}: SectorSize {sector_size} is not a PoRep sector size "
            f"({', '.join(str(size) for size in SECTOR_SIZES)})"
        )
    return C1Input(
        path=path,
        sector_number=_uint_field(envelope, "SectorNum", 1, path),
        sector_size=sector_size,
        data=data,
    )


def build_submit_request(
    c1: C1Input,
    kind: str = "porep",
    *,
    miner_id: int = DEFAULT_MINER_ID,
    request_id: str = "",
    priority: pb.Priority = pb.PRIORITY_UNSPECIFIED,
) -> pb.SubmitProofRequest:
    """A ``SubmitProofRequest`` proving ``c1`` (PoRep only, see :func:`c1_proof_kind`), with
    cuzk-bench's fields: the file's bytes as ``vanilla_proof``, the envelope's sector number
    and size. An empty ``request_id`` is filled in per proof by the client."""
    proof_kind = c1_proof_kind(kind)
    return pb.SubmitProofRequest(
        request_id=request_id,
        proof_kind=proof_kind,
        sector_size=c1.sector_size,
        priority=priority,
        vanilla_proof=c1.data,
        sector_number=c1.sector_number,
        miner_id=miner_id,
    )
