"""Fault switch grammar and trigger rules (pure)."""

from __future__ import annotations

import pytest

from cuzk_supervisor.sim.faults import (
    DEFAULT_FAIL_MESSAGE,
    Checkpoint,
    FaultSpec,
    FaultSpecError,
    is_due,
    parse_fault,
    parse_faults,
)


def test_kind_arg_and_triggers_parse() -> None:
    spec = parse_fault("exit:3,after_proofs=2,after_s=1.5,times=0")
    assert spec == FaultSpec(
        "exit", "3", 2, 1.5, None, 0, "exit:3,after_proofs=2,after_s=1.5,times=0"
    )
    assert spec.number == 3
    assert parse_fault("drop,at_partition=4").at_partition == 4
    assert parse_fault("oom:120").number == 120.0


def test_fail_message_keeps_its_commas_and_has_a_default() -> None:
    assert parse_fault("fail:disk full, retry later,times=2").message == "disk full, retry later"
    assert parse_fault("fail:disk full, retry later,times=2").times == 2
    assert parse_fault("fail").message == DEFAULT_FAIL_MESSAGE


def test_flags_and_env_are_combined() -> None:
    specs = parse_faults(["hang,after_s=5"], "exit:2 ; flood:100;")
    assert [s.kind for s in specs] == ["hang", "exit", "flood"]


@pytest.mark.parametrize(
    "text",
    [
        "explode",
        "exit",
        "exit:x",
        "oom",
        "flood:1.5",
        "drop:now",
        "hang,after_s=-1",
        "exit:1,after_proofs=1,bogus=2",
        "fork-grandchild",
    ],
)
def test_bad_switches_are_refused(text: str) -> None:
    with pytest.raises(FaultSpecError):
        parse_fault(text)


def cp(point: str, **kw: object) -> Checkpoint:
    return Checkpoint(point, **kw)  # type: ignore[arg-type]


def test_all_triggers_must_hold() -> None:
    spec = parse_fault("exit:1,after_proofs=2,after_s=3")
    assert not is_due(spec, 0, cp("completed", proofs_completed=2, elapsed_s=1))
    assert not is_due(spec, 0, cp("completed", proofs_completed=1, elapsed_s=5))
    assert is_due(spec, 0, cp("completed", proofs_completed=2, elapsed_s=5))


def test_times_limits_firing_and_zero_is_unlimited() -> None:
    once, always = parse_fault("drop"), parse_fault("drop,times=0")
    assert is_due(once, 0, cp("partition", partition=0))
    assert not is_due(once, 1, cp("partition", partition=0))
    assert is_due(always, 99, cp("partition", partition=0))


def test_at_partition_matches_only_that_partition() -> None:
    spec = parse_fault("drop,at_partition=3")
    assert not is_due(spec, 0, cp("partition", partition=2))
    assert is_due(spec, 0, cp("partition", partition=3))
    assert not is_due(spec, 0, cp("timer"))


def test_each_kind_listens_to_its_checkpoints() -> None:
    assert is_due(parse_fault("exit:1"), 0, cp("start"))
    assert not is_due(parse_fault("drop"), 0, cp("start"))  # nobody to drop yet
    assert is_due(parse_fault("never-ready"), 0, cp("bind"))
    assert not is_due(parse_fault("never-ready"), 0, cp("start"))
    # fail: at the end of a proof unless at_partition says where.
    assert is_due(parse_fault("fail:x"), 0, cp("finishing"))
    assert not is_due(parse_fault("fail:x"), 0, cp("partition", partition=0))
    assert is_due(parse_fault("fail:x,at_partition=0"), 0, cp("partition", partition=0))
    assert not is_due(parse_fault("fail:x,at_partition=0"), 0, cp("finishing"))


def test_oom_fires_only_past_its_limit() -> None:
    spec = parse_fault("oom:60")
    assert not is_due(spec, 0, cp("memory", memory_gib=60.0))
    assert is_due(spec, 0, cp("memory", memory_gib=60.5))
    assert not is_due(spec, 0, cp("partition", partition=0, memory_gib=99))


@pytest.mark.parametrize(
    "text",
    ["freeze", "freeze:soon", "cancel-early", "cancel", "cancel:everything", "cancel:submit"],
)
def test_transport_faults_need_their_argument(text: str) -> None:
    with pytest.raises(FaultSpecError):
        parse_fault(text)


def test_cancel_fires_only_for_the_call_it_names() -> None:
    before = parse_fault("cancel:submit-before")
    after = parse_fault("cancel:submit-after")
    status = parse_fault("cancel:status,times=0")
    assert (before.call, after.call, status.call) == ("submit", "submit", "status")
    at_submit = Checkpoint("call", call="submit")
    at_status = Checkpoint("call", call="status")
    assert is_due(before, 0, at_submit)
    assert is_due(after, 0, at_submit)
    assert not is_due(before, 0, at_status)
    assert is_due(status, 99, at_status)
    assert not is_due(status, 0, Checkpoint("partition", partition=1))


def test_freeze_listens_where_drop_does_and_cancel_early_at_start() -> None:
    freeze = parse_fault("freeze:60,at_partition=5")
    assert freeze.number == 60.0
    assert is_due(freeze, 0, Checkpoint("partition", partition=5))
    assert not is_due(freeze, 0, Checkpoint("start"))
    assert is_due(parse_fault("cancel-early:0.2"), 0, Checkpoint("start"))
