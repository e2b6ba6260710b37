"""C1 files and proof kinds: good input becomes a request; bad input is one clear UsageError."""

from __future__ import annotations

import base64
import json

import pytest

from cuzk_supervisor.adapters.proving.proofinput import (
    DEFAULT_MINER_ID,
    PROOF_KINDS,
    SECTOR_SIZE_32GIB,
    build_submit_request,
    c1_proof_kind,
    load_c1,
    parse_proof_kind,
)
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.proto import proving_pb2 as pb

PHASE1 = base64.b64encode(json.dumps({"registered_proof": "StackedDrg32GiBV1_1"}).encode()).decode()


def write_c1(tmp_path, envelope, name="c1.json"):
    path = tmp_path / name
    path.write_text(envelope if isinstance(envelope, str) else json.dumps(envelope))
    return path


def test_good_c1_is_loaded_and_sent_as_it_is(tmp_path):
    path = write_c1(
        tmp_path, {"SectorNum": 7, "Phase1Out": PHASE1, "SectorSize": SECTOR_SIZE_32GIB}
    )
    c1 = load_c1(path)
    assert (c1.sector_number, c1.sector_size, c1.path) == (7, SECTOR_SIZE_32GIB, path)
    assert c1.data == path.read_bytes()
    request = build_submit_request(c1, "porep")
    assert request.proof_kind == pb.POREP_SEAL_COMMIT
    assert request.vanilla_proof == path.read_bytes()
    assert request.sector_number == 7
    assert request.sector_size == SECTOR_SIZE_32GIB
    assert request.miner_id == DEFAULT_MINER_ID
    assert request.request_id == ""


def test_missing_numbers_take_cuzk_bench_defaults(tmp_path):
    c1 = load_c1(write_c1(tmp_path, {"Phase1Out": PHASE1}))
    assert (c1.sector_number, c1.sector_size) == (1, SECTOR_SIZE_32GIB)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "is not JSON"),
        ("\udcff", "is not JSON"),
        ("[1, 2]", "is not a JSON object (got list)"),
        ('"text"', "is not a JSON object (got str)"),
        ("{}", "has no Phase1Out"),
        ('{"Phase1Out": ""}', "has no Phase1Out"),
        ('{"Phase1Out": 5}', "has no Phase1Out"),
        ('{"Phase1Out": "not base64!"}', "Phase1Out is not valid base64"),
        (json.dumps({"Phase1Out": PHASE1, "SectorNum": -1}), "SectorNum must be"),
        (json.dumps({"Phase1Out": PHASE1, "SectorSize": "32G"}), "SectorSize must be"),
        (json.dumps({"Phase1Out": PHASE1, "SectorNum": True}), "SectorNum must be"),
    ],
)
def test_bad_c1_is_one_line_naming_the_file(tmp_path, content, expected):
    path = tmp_path / "bad.json"
    if content == "\udcff":
        path.write_bytes(b"\xff\xfe\x00garbage")
    else:
        path.write_text(content)
    with pytest.raises(UsageError) as caught:
        load_c1(path)
    message = str(caught.value)
    assert expected in message
    assert str(path) in message
    assert "\n" not in message


def test_unreadable_c1_names_the_file(tmp_path):
    for path in (tmp_path / "missing.json", tmp_path):  # absent; a directory
        with pytest.raises(UsageError, match="cannot read C1 file") as caught:
            load_c1(path)
        assert str(path) in str(caught.value)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("porep", pb.POREP_SEAL_COMMIT),
        ("PoRep", pb.POREP_SEAL_COMMIT),
        ("porep-c2", pb.POREP_SEAL_COMMIT),
        ("snap", pb.SNAP_DEALS_UPDATE),
        ("wpost", pb.WINDOW_POST_PARTITION),
        ("window-post", pb.WINDOW_POST_PARTITION),
        ("winning", pb.WINNING_POST),
    ],
)
def test_proof_kind_names(name, kind):
    assert parse_proof_kind(name) == kind


def test_unknown_proof_kind_lists_the_allowed_ones():
    with pytest.raises(UsageError) as caught:
        parse_proof_kind("c2")
    for name in PROOF_KINDS:
        assert name in str(caught.value)


def test_only_porep_takes_a_c1_file():
    assert c1_proof_kind("porep") == pb.POREP_SEAL_COMMIT
    with pytest.raises(UsageError, match="only porep"):
        c1_proof_kind("snap")
