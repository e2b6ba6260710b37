"""The simulator's GPU faults and demand (issue 34), as values: the switches parse (and refuse
what the daemon would), the GPUs' condition follows each XID, the demand pattern parses."""

from __future__ import annotations

import pytest

from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.sim.demand import Stretch, parse_pattern
from cuzk_supervisor.sim.faults import Checkpoint, FaultSpecError, is_due, parse_fault
from cuzk_supervisor.sim.machine.gpustate import GpuState, gpu_and_number


@pytest.mark.parametrize(
    ("text", "arg"),
    [("gpu-lost:1", "1"), ("xid:48", "48"), ("xid:94@1", "94@1"), ("throttle:0.5@0", "0.5@0"),
     ("corrupt:0,after_proofs=12", "0"), ("gpu-crash:0", "0"), ("stuck,at_partition=3", None)],
)  # fmt: skip
def test_the_gpu_switches_parse(text: str, arg: str | None) -> None:
    assert parse_fault(text).arg == arg


@pytest.mark.parametrize(
    "text", ["gpu-lost", "xid:48@x", "xid:4.8", "throttle:fast", "stuck:1", "corrupt:-1"]
)
def test_what_the_daemon_would_refuse_is_refused(text: str) -> None:
    with pytest.raises(FaultSpecError):
        parse_fault(text)


def test_stuck_is_decided_as_a_partition_reaches_a_gpu_worker() -> None:
    spec = parse_fault("stuck,at_partition=3")
    assert is_due(spec, 0, Checkpoint("gpu", partition=3))
    assert not is_due(spec, 0, Checkpoint("gpu", partition=2))
    assert not is_due(spec, 0, Checkpoint("partition", partition=3))
    assert gpu_and_number("94@1") == (94.0, 1)
    assert gpu_and_number("0.5") == (0.5, 0)


def test_each_xid_changes_the_condition_as_nvml_would_report_it() -> None:
    state = GpuState(gpus=2)
    state.xid(1, 63)
    state.xid(1, 94)
    state.xid(1, 48)
    one = state.condition(1)
    assert (one.ecc_uncorrected, one.retired_pages, one.retirement_pending) == (2, 2, True)
    assert not one.lost
    state.lose(0)
    assert state.condition(0).lost == "fell off the bus"
    assert [x for _, _, x in state.xids] == [63, 94, 48, 79]
    assert state.condition(1).lost == ""


def test_the_demand_pattern() -> None:
    assert parse_pattern("busy:2h@2, idle:30m,busy:45s@1") == (
        Stretch(True, 7200.0, 2), Stretch(False, 1800.0), Stretch(True, 45.0, 1))  # fmt: skip
    for bad in ("busy:2h", "idle:1h@2", "busy:1h@0", "nap:1h", "busy:1d@1"):
        with pytest.raises(UsageError):
            parse_pattern(bad)
