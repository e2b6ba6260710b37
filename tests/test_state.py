"""The durable state file: round trip, atomic and durable saves, bad files moved aside."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import os
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from cuzk_supervisor.adapters import files
from cuzk_supervisor.adapters.files import FileOps
from cuzk_supervisor.adapters.state.doc import (
    MAX_FAILURES,
    STATE_VERSION,
    BenchRecord,
    Report,
    SupervisorState,
)
from cuzk_supervisor.adapters.state.fields import StateFormatError
from cuzk_supervisor.adapters.state.store import (
    Loaded,
    StateFolderUnsafe,
    StateKeeper,
    StateStore,
    StateWriteError,
)
from cuzk_supervisor.core.reports import BENCH_DONE, OUTCOME_OK, PARAM_DONE, RUNNING

FIXED_NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z
CORRUPT_NAME = "state.json.corrupt-20231114T221320Z"


class SimulatedCrash(BaseException):
    """The process dies here (not an Exception: nothing is supposed to handle it)."""


def full_state() -> SupervisorState:
    return SupervisorState(
        phase="bench",
        uuid="u-1",
        runner_id=7,
        label="C.123",
        plan={"warmup_workers": 2, "full_workers": 7, "gpus": ["A40", "A40"]},
        pce_ready=True,
        params_verified=True,
        bench=(BenchRecord(rate=41.3, completed=12, wall_s=1046.0, plan={"full_workers": 7}),),
        failures=("warmup: oom_killed", "settle: timeout"),
        outbox=(Report(kind=RUNNING, uuid="u-1"), Report(kind=BENCH_DONE, uuid="u-1", rate=41.3)),
        acked=(
            dataclasses.replace(
                Report(kind=PARAM_DONE, uuid="u-1"), outcome=OUTCOME_OK, finished_at="x"
            ),
        ),
    )


def store_at(tmp_path: Path, **kwargs) -> StateStore:
    return StateStore(tmp_path / "state.json", clock=lambda: FIXED_NOW, **kwargs)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# --- round trip --------------------------------------------------------------------------------


def test_round_trip_keeps_every_field(tmp_path):
    store = store_at(tmp_path)
    saved = store.save(full_state())
    assert saved.updated_at == "2023-11-14T22:13:20.000Z"
    loaded = store.load_detailed()
    assert loaded.status == "loaded"
    assert loaded.state == saved
    assert json.loads(store.path.read_text())["version"] == STATE_VERSION


def test_missing_file_is_a_fresh_state_and_creates_nothing(tmp_path):
    store = store_at(tmp_path)
    loaded = store.load_detailed()
    assert loaded.status == "missing"
    assert loaded.state == SupervisorState()
    assert list(tmp_path.iterdir()) == []


def test_save_creates_the_folder(tmp_path):
    store = StateStore(tmp_path / "a" / "b" / "state.json")
    store.save(SupervisorState(phase="params"))
    assert store.load().phase == "params"


def test_keys_missing_from_an_older_v1_file_take_defaults(tmp_path):
    store = store_at(tmp_path)
    store.path.write_text(json.dumps({"version": 1, "phase": "plan", "uuid": "u", "extra": 1}))
    state = store.load()
    assert state == SupervisorState(phase="plan", uuid="u")


def test_failures_keep_only_the_most_recent():
    state = SupervisorState()
    for n in range(MAX_FAILURES + 5):
        state = state.with_failure(f"f{n}")
    assert len(state.failures) == MAX_FAILURES
    assert state.failures[-1] == f"f{MAX_FAILURES + 4}"
    assert state.failures[0] == "f5"


def test_nan_rate_is_refused_before_anything_is_written():
    with pytest.raises(ValueError, match="finite rate"):
        Report(kind=BENCH_DONE, uuid="u", rate=float("nan"))


_text = st.text(max_size=20)
_reports = st.builds(
    Report,
    kind=st.sampled_from([PARAM_DONE, RUNNING]),
    uuid=st.text(min_size=1, max_size=10),
) | st.builds(
    Report,
    kind=st.just(BENCH_DONE),
    uuid=st.text(min_size=1, max_size=10),
    rate=st.floats(min_value=0, max_value=1e6, allow_nan=False),
)
_states = st.builds(
    SupervisorState,
    phase=_text,
    uuid=st.none() | _text,
    runner_id=st.none() | st.integers(-(2**53), 2**53),
    label=st.none() | _text,
    plan=st.none() | st.dictionaries(_text, st.integers() | _text, max_size=3),
    pce_ready=st.booleans(),
    params_verified=st.booleans(),
    bench=st.lists(
        st.builds(
            BenchRecord,
            rate=st.floats(min_value=0, max_value=1e6, allow_nan=False),
            completed=st.integers(0, 1000),
            wall_s=st.floats(min_value=0, max_value=1e6, allow_nan=False),
            plan=st.dictionaries(_text, st.integers(), max_size=3),
            at=_text,
        ),
        max_size=3,
    ).map(tuple),
    failures=st.lists(_text, max_size=3).map(tuple),
    outbox=st.lists(_reports, max_size=3).map(tuple),
    updated_at=st.none() | _text,
)


@settings(max_examples=60, deadline=None)
@given(_states)
def test_any_state_survives_json(state):
    assert SupervisorState.from_json(state.to_json()) == state


# --- atomic and durable -------------------------------------------------------------------------


def test_save_fsyncs_the_file_and_then_the_folder(tmp_path):
    calls: list[str] = []

    def fsync(fd: int) -> None:
        calls.append("dir" if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")) else "file")
        os.fsync(fd)

    def replace(src: str, dst: str) -> None:
        calls.append("replace")
        os.replace(src, dst)

    store = store_at(tmp_path, ops=FileOps(fsync=fsync, replace=replace))
    store.save(SupervisorState())
    assert calls == ["file", "replace", "dir"]


def test_crash_between_write_and_rename_leaves_the_old_file(tmp_path):
    good = store_at(tmp_path)
    old = good.save(SupervisorState(phase="params", uuid="old"))

    def crash(src: str, dst: str) -> None:
        raise SimulatedCrash

    crashing = store_at(tmp_path, ops=FileOps(replace=crash))
    with pytest.raises(SimulatedCrash):
        crashing.save(SupervisorState(phase="bench", uuid="new"))
    assert good.load() == old
    assert leftovers(tmp_path) == []


def test_rename_failure_is_a_write_error_and_keeps_the_old_file(tmp_path):
    good = store_at(tmp_path)
    old = good.save(SupervisorState(phase="params"))

    def refuse(src: str, dst: str) -> None:
        raise OSError(errno.EACCES, "Permission denied")

    with pytest.raises(StateWriteError):
        store_at(tmp_path, ops=FileOps(replace=refuse)).save(SupervisorState(phase="bench"))
    assert good.load() == old
    assert leftovers(tmp_path) == []


def test_a_temp_file_left_by_a_real_crash_does_not_disturb_load_or_save(tmp_path):
    store = store_at(tmp_path)
    store.save(SupervisorState(phase="params"))
    (tmp_path / ".state.json.abc.tmp").write_text('{"half": ')
    assert store.load().phase == "params"
    store.save(SupervisorState(phase="plan"))
    assert store.load().phase == "plan"


def test_disk_full_raises_state_write_error_naming_path_and_error(tmp_path):
    good = store_at(tmp_path)
    old = good.save(SupervisorState(phase="params"))
    written: list[int] = []

    def full_disk(fd: int, data: bytes) -> int:
        if written:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        # A short write first: the loop must continue with the rest, then hit the full disk.
        written.append(os.write(fd, data[:10]))
        return written[-1]

    store = store_at(tmp_path, ops=FileOps(write=full_disk))
    with pytest.raises(StateWriteError) as caught:
        store.save(SupervisorState(phase="bench"))
    message = str(caught.value)
    assert "\n" not in message
    assert str(store.path) in message
    assert "No space left on device" in message
    assert caught.value.error.errno == errno.ENOSPC
    assert good.load() == old
    assert leftovers(tmp_path) == []


def test_unwritable_folder_raises_state_write_error(tmp_path):
    # Tests run as root, where chmod does not stop writes: make the parent a file instead.
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    store = StateStore(blocker / "state.json")
    with pytest.raises(
        StateWriteError, match=r"cannot write state file .*not-a-folder/state\.json"
    ):
        store.save(SupervisorState())


def test_short_writes_are_completed(tmp_path):
    def one_byte_at_a_time(fd: int, data: bytes) -> int:
        return os.write(fd, data[:1])

    store = store_at(tmp_path, ops=FileOps(write=one_byte_at_a_time))
    saved = store.save(SupervisorState(phase="run", label="C.1"))
    assert store.load() == saved


# --- bad files are moved aside ------------------------------------------------------------------


def assert_moved_aside(store: StateStore, original: bytes | None, problem_part: str) -> None:
    with capture_logs() as logs:
        loaded = store.load_detailed()
    assert loaded.status == "recovered"
    assert loaded.state == SupervisorState()
    assert problem_part in (loaded.problem or "")
    assert loaded.moved_to == store.path.with_name(CORRUPT_NAME)
    assert not store.path.exists()
    if original is not None:
        assert loaded.moved_to.read_bytes() == original
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1
    assert warnings[0]["event"] == "state.corrupt"
    assert problem_part in warnings[0]["problem"]


def test_garbage_is_moved_aside(tmp_path):
    store = store_at(tmp_path)
    store.path.write_bytes(b'{"version": 1, "phase": "bench", "uu')
    assert_moved_aside(store, b'{"version": 1, "phase": "bench", "uu', "not JSON")


def test_unknown_version_is_moved_aside(tmp_path):
    store = store_at(tmp_path)
    data = json.dumps({"version": 2, "phase": "run"}).encode()
    store.path.write_bytes(data)
    assert_moved_aside(store, data, "unknown version 2")


def test_non_utf8_is_moved_aside(tmp_path):
    store = store_at(tmp_path)
    store.path.write_bytes(b"\xff\xfe\x00garbage")
    assert_moved_aside(store, b"\xff\xfe\x00garbage", "unreadable")


def test_unreadable_path_is_moved_aside(tmp_path):
    store = store_at(tmp_path)
    store.path.mkdir()  # reading a folder fails with IsADirectoryError
    assert_moved_aside(store, None, "unreadable")


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ([1, 2], "top level is list"),
        ({"version": 1}, "state.phase is missing"),
        ({"version": 1, "phase": 3}, "state.phase is int"),
        ({"version": 1, "phase": "x", "runner_id": True}, "state.runner_id"),
        ({"version": 1, "phase": "x", "pce_ready": "yes"}, "state.pce_ready"),
        ({"version": 1, "phase": "x", "outbox": {}}, "state.outbox is dict"),
        ({"version": 1, "phase": "x", "outbox": [{"kind": "reboot"}]}, "outbox[0]"),
        (
            {
                "version": 1,
                "phase": "x",
                "outbox": [{"kind": "bench_done", "uuid": "u", "id": "i", "created_at": "t"}],
            },
            "outbox[0]: bench_done needs a finite rate",
        ),
        ({"version": 1, "phase": "x", "bench": [{"rate": 1.0}]}, "bench[0].completed"),
        ({"version": 1, "phase": "x", "failures": [1]}, "failures[0]"),
    ],
)
def test_wrong_shape_is_moved_aside(tmp_path, document, problem):
    store = store_at(tmp_path)
    data = json.dumps(document).encode()
    store.path.write_bytes(data)
    assert_moved_aside(store, data, problem)


def test_a_second_corrupt_file_in_the_same_second_gets_its_own_name(tmp_path):
    store = store_at(tmp_path)
    store.path.write_text("junk 1")
    first = store.load_detailed().moved_to
    store.path.write_text("junk 2")
    second = store.load_detailed().moved_to
    assert first != second
    assert first is not None
    assert second is not None
    assert first.read_text() == "junk 1"
    assert second.read_text() == "junk 2"


def test_from_json_error_names_the_problem():
    with pytest.raises(StateFormatError, match="expected an object"):
        SupervisorState.from_json("[]")


# --- the keeper ---------------------------------------------------------------------------------


async def test_keeper_makes_a_change_visible_only_after_it_is_saved(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    keeper = StateKeeper(StateStore(blocker / "state.json"), SupervisorState(phase="params"))
    with pytest.raises(StateWriteError):
        await keeper.update(lambda s: dataclasses.replace(s, phase="bench"))
    assert keeper.state.phase == "params"


async def test_keeper_applies_concurrent_changes_in_call_order(tmp_path):
    store = store_at(tmp_path)
    keeper = StateKeeper(store)
    await asyncio.gather(
        keeper.update(lambda s: dataclasses.replace(s, phase="params")),
        keeper.update(lambda s: s.with_failure("a")),
        keeper.update(lambda s: dataclasses.replace(s, phase="plan")),
        keeper.save_outbox((Report(kind=RUNNING, uuid="u"),), ()),
    )
    on_disk = store.load()
    assert on_disk == keeper.state
    assert on_disk.phase == "plan"
    assert on_disk.failures == ("a",)
    assert len(on_disk.outbox) == 1


# --- files the supervisor owns (issue 13, item 6) ------------------------------------------------


def test_state_file_is_0600_and_its_folder_0750_under_umask_0(tmp_path):
    old = os.umask(0)
    try:
        store = StateStore(tmp_path / "state" / "state.json")
        store.save(full_state())
    finally:
        os.umask(old)
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.path.parent.stat().st_mode) == 0o750


def test_a_fifo_as_the_state_file_is_moved_aside_without_blocking(tmp_path):
    store = store_at(tmp_path)
    os.mkfifo(store.path)
    done: list[Loaded] = []
    thread = threading.Thread(target=lambda: done.append(store.load_detailed()), daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "load blocked on the FIFO"
    (loaded,) = done
    assert loaded.status == "recovered"
    assert loaded.problem is not None
    assert "FIFO" in loaded.problem
    assert loaded.moved_to is not None
    assert stat.S_ISFIFO(os.lstat(loaded.moved_to).st_mode)
    store.save(full_state())  # a regular file from now on
    assert store.load_detailed().status == "loaded"


def test_a_world_writable_state_folder_is_fixed_with_a_warning(tmp_path):
    folder = tmp_path / "state"
    folder.mkdir()
    folder.chmod(0o777)
    store = StateStore(folder / "state.json")
    with capture_logs() as logs:
        assert store.load_detailed().status == "missing"
    assert not stat.S_IMODE(folder.stat().st_mode) & 0o002
    assert [e["event"] for e in logs] == ["state.folder_mode_fixed"]


def test_a_world_writable_state_folder_that_cannot_be_fixed_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "state"
    folder.mkdir()
    folder.chmod(0o777)

    def refuse(path, mode):
        raise PermissionError(errno.EPERM, "Operation not permitted", str(path))

    monkeypatch.setattr(files.os, "chmod", refuse)
    with pytest.raises(StateFolderUnsafe, match="world-writable") as caught:
        StateStore(folder / "state.json").load()
    assert caught.value.exit_code == 2
    assert "\n" not in str(caught.value)


def test_a_file_where_the_state_folder_should_be_is_a_write_error_not_a_refusal(tmp_path):
    (tmp_path / "blocker").write_text("a file where a folder should be")
    store = StateStore(tmp_path / "blocker" / "state" / "state.json")
    assert store.load_detailed().state == SupervisorState()
    with pytest.raises(StateWriteError, match=r"\[Errno 20\]"):
        store.save(full_state())
