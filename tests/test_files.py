"""cuzk_supervisor.adapters.files: the modes we choose whatever the umask, no planted link
followed, no open
that blocks on a FIFO, a world-writable folder fixed or refused."""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cuzk_supervisor.adapters import files


@pytest.fixture
def umask0() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_folders_and_files_get_our_modes_under_umask_0(tmp_path: Path, umask0: None) -> None:
    target = tmp_path / "a" / "b" / "file"
    files.atomic_write(target, b"data")
    files.atomic_write(tmp_path / "a" / "private", b"secret", files.PRIVATE_MODE)
    assert mode(tmp_path / "a") == 0o750
    assert mode(tmp_path / "a" / "b") == 0o750
    assert mode(target) == 0o640
    assert mode(tmp_path / "a" / "private") == 0o600
    with files.open_append(tmp_path / "a" / "log") as handle:
        handle.write(b"line\n")
    assert mode(tmp_path / "a" / "log") == 0o640
    assert target.read_bytes() == b"data"


def test_an_existing_folder_keeps_its_mode(tmp_path: Path) -> None:
    folder = tmp_path / "operator"
    folder.mkdir()
    folder.chmod(0o755)
    files.make_folder(folder)
    assert mode(folder) == 0o755


def test_a_file_where_a_folder_should_be_is_an_os_error(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("x")
    with pytest.raises(NotADirectoryError):
        files.atomic_write(tmp_path / "blocker" / "file", b"data")


def test_a_planted_link_at_the_temp_path_is_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    folder = tmp_path / "run"
    folder.mkdir()
    # The temp names we will draw, with a link planted at the first one.
    names = iter(["planted", "fresh"])
    monkeypatch.setattr(files.secrets, "token_hex", lambda _n: next(names))
    (folder / ".cuzk.toml.planted.tmp").symlink_to(outside)
    files.atomic_write(folder / "cuzk.toml", b"new")
    assert outside.read_bytes() == b"precious"
    assert (folder / "cuzk.toml").read_bytes() == b"new"
    assert (folder / ".cuzk.toml.planted.tmp").is_symlink()  # left alone, not ours
    assert not (folder / ".cuzk.toml.fresh.tmp").exists()


def test_no_free_temp_name_is_an_error_not_a_write_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    monkeypatch.setattr(files.secrets, "token_hex", lambda _n: "same")
    (tmp_path / ".f.same.tmp").symlink_to(outside)
    with pytest.raises(FileExistsError):
        files.atomic_write(tmp_path / "f", b"new")
    assert outside.read_bytes() == b"precious"
    assert not (tmp_path / "f").exists()


def test_a_failed_write_leaves_no_temp_file_and_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "f"
    files.atomic_write(target, b"old")

    def full(_fd: int, _data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space") as caught:
        files.atomic_write(target, b"new", ops=files.FileOps(write=full))
    assert caught.value.errno == errno.ENOSPC
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def _no_hang(call: Callable[[], object], timeout: float = 5.0) -> object:
    """Run ``call`` in a thread; fail (rather than hang the suite) if it blocks."""
    result: list[object] = []

    def target() -> None:
        try:
            result.append(call())
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "blocked"
    return result[0]


def test_a_fifo_is_not_opened_for_reading_or_appending(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    read = _no_hang(lambda: files.read_regular(fifo))
    assert isinstance(read, files.NotARegularFile), read
    assert "FIFO" in str(read)
    appended = _no_hang(lambda: files.open_append(fifo))
    assert isinstance(appended, files.NotARegularFile), appended


def test_append_never_follows_a_link_and_read_refuses_a_device(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    (tmp_path / "log").symlink_to(outside)
    with pytest.raises(files.NotARegularFile, match="symbolic link"):
        files.open_append(tmp_path / "log")
    assert outside.read_bytes() == b"precious"
    with pytest.raises(files.NotARegularFile, match="character device"):
        files.read_regular("/dev/zero")
    with pytest.raises(OSError, match="larger than"):
        files.read_regular(outside, max_bytes=3)


def test_append_narrows_a_file_found_with_a_wider_mode(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"old\n")
    log.chmod(0o666)
    files.open_append(log).close()
    assert mode(log) == 0o640


def test_a_world_writable_folder_is_fixed(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    folder.chmod(0o777)
    assert files.ensure_private_folder(folder) is True
    assert mode(folder) == 0o755
    assert files.ensure_private_folder(folder) is False


def test_a_world_writable_folder_that_cannot_be_fixed_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    folder.chmod(0o777)

    def refuse(path: object, mode: int) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted", str(path))

    monkeypatch.setattr(files.os, "chmod", refuse)
    with pytest.raises(PermissionError):
        files.ensure_private_folder(folder)


def test_write_error_is_one_line_naming_what_path_and_why(tmp_path: Path) -> None:
    error = files.WriteError(
        "daemon config", tmp_path / "cuzk.toml", OSError(errno.ENOSPC, "No space left on device")
    )
    assert str(error) == (
        f"cannot write daemon config {tmp_path / 'cuzk.toml'}: [Errno 28] No space left on device"
    )
