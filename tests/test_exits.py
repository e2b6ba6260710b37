"""Exit classification: the facts of one daemon run → the named kind of exit."""

import signal

import pytest

from cuzk_supervisor.core.exits import ExitFacts, ExitKind, classify_exit

SIGKILL = -int(signal.SIGKILL)


def test_zero_exit_after_ready_is_clean():
    assert classify_exit(ExitFacts(returncode=0, was_ready=True)).kind is ExitKind.CLEAN


def test_nonzero_exit_after_ready_is_a_crash_with_code_and_last_line():
    result = classify_exit(ExitFacts(returncode=3, was_ready=True, last_lines=("a", "boom")))
    assert result.kind is ExitKind.CRASHED
    assert result.code == 3
    assert "boom" in result.reason


def test_sigkill_without_oom_evidence_is_killed():
    result = classify_exit(
        ExitFacts(returncode=SIGKILL, was_ready=True, oom_kills_before=2, oom_kills_after=2)
    )
    assert result.kind is ExitKind.KILLED
    assert result.signal == signal.SIGKILL


def test_sigkill_with_oom_kill_counter_bump_is_oom_killed():
    result = classify_exit(
        ExitFacts(returncode=SIGKILL, was_ready=True, oom_kills_before=2, oom_kills_after=3)
    )
    assert result.kind is ExitKind.OOM_KILLED
    assert result.cgroup_oom_kills == 1


def test_sigkill_with_memory_at_limit_is_oom_killed_without_counter():
    result = classify_exit(ExitFacts(returncode=SIGKILL, was_ready=True, memory_at_limit=True))
    assert result.kind is ExitKind.OOM_KILLED


def test_oom_kill_before_ready_is_still_oom():
    result = classify_exit(
        ExitFacts(returncode=SIGKILL, was_ready=False, oom_kills_before=0, oom_kills_after=1)
    )
    assert result.kind is ExitKind.OOM_KILLED


def test_our_own_sigkill_after_grace_is_not_oom():
    result = classify_exit(
        ExitFacts(
            returncode=SIGKILL,
            was_ready=True,
            stop_requested=True,
            oom_kills_before=0,
            oom_kills_after=0,
        )
    )
    assert result.kind is ExitKind.CLEAN


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (("Error: Address already in use (os error 98)",), "address in use"),
        (("starting", "panic: no SRS"), "panic: no SRS"),
    ],
)
def test_exit_before_ready_is_failed_to_start_with_reason(lines, expected):
    result = classify_exit(ExitFacts(returncode=1, was_ready=False, last_lines=lines))
    assert result.kind is ExitKind.FAILED_TO_START
    assert expected in result.reason


def test_other_signal_is_killed_with_its_name():
    result = classify_exit(ExitFacts(returncode=-int(signal.SIGSEGV), was_ready=True))
    assert result.kind is ExitKind.KILLED
    assert "SIGSEGV" in result.reason


def test_address_in_use_is_permanent_but_an_early_crash_is_retryable():
    in_use = classify_exit(
        ExitFacts(returncode=1, was_ready=False, last_lines=("Address already in use",))
    )
    early = classify_exit(ExitFacts(returncode=7, was_ready=False, last_lines=("bye",)))
    assert in_use.permanent
    assert not early.permanent
    assert early.kind is ExitKind.FAILED_TO_START


def test_killed_for_missing_liveness_probes_says_so():
    result = classify_exit(
        ExitFacts(returncode=SIGKILL, was_ready=True, unresponsive="unresponsive: 3 probes")
    )
    assert result.kind is ExitKind.KILLED
    assert "unresponsive" in result.reason
