"""Child output: ANSI stripped, every line kept whole, rotation between lines, bounded events."""

import asyncio
import os
import stat
import threading

import pytest
from fshelpers import full_tmpfs, make_room
from structlog.testing import capture_logs

from cuzk_supervisor.adapters import files
from cuzk_supervisor.daemon.output import OutputPump, RotatingLineFile, strip_ansi


def test_strip_ansi_removes_colours_and_keeps_text():
    raw = b"\x1b[2m2026-11-29T16:00:00Z\x1b[0m \x1b[32m INFO\x1b[0m cuzk_daemon: ready"
    assert strip_ansi(raw) == b"2026-11-29T16:00:00Z  INFO cuzk_daemon: ready"


def test_rotation_keeps_whole_lines_and_bounded_files(tmp_path):
    path = tmp_path / "cuzk.log"
    out = RotatingLineFile(path, max_bytes=4096, backups=2)
    lines = [f"line {i:05d} {'x' * 50}\n".encode() for i in range(1000)]
    out.write_lines(lines)
    out.close()
    files = [path, path.with_name("cuzk.log.1"), path.with_name("cuzk.log.2")]
    assert not path.with_name("cuzk.log.3").exists()
    for f in files:
        assert f.stat().st_size <= 4096
        assert f.read_bytes().endswith(b"\n")
    kept = b"".join(f.read_bytes() for f in reversed(files)).splitlines(keepends=True)
    assert kept == lines[-len(kept) :]


async def test_pump_keeps_every_line_and_limits_events(tmp_path):
    path = tmp_path / "cuzk.log"
    log_file = RotatingLineFile(path, max_bytes=1 << 30, backups=0)
    pump = OutputPump("cuzk", log_file, events_per_second=10)
    reader = asyncio.StreamReader()
    total = 20_000
    payload = b"".join(f"\x1b[32mline {i}\x1b[0m\n".encode() for i in range(total))
    # Feed in odd-sized chunks so lines are split across reads.
    for start in range(0, len(payload), 7777):
        reader.feed_data(payload[start : start + 7777])
    reader.feed_data(b"no newline at end")
    reader.feed_eof()
    await pump.pump(reader, "stdout")
    log_file.close()
    written = path.read_bytes().splitlines()
    assert len(written) == total + 1
    assert written[0] == b"line 0"
    assert written[total - 1] == f"line {total - 1}".encode()
    assert written[-1] == b"no newline at end"
    assert pump.lines_total == total + 1
    assert pump.tail[-1] == "no newline at end"


# --- files the supervisor owns (issue 13, items 2 and 6) -----------------------------------------


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_log_files_and_folder_get_our_modes_under_umask_0(tmp_path):
    old = os.umask(0)
    try:
        path = tmp_path / "log" / "cuzk.log"
        out = RotatingLineFile(path, max_bytes=1024, backups=2)
        out.write_lines([f"line {i:04d} {'x' * 60}\n".encode() for i in range(100)])
        out.close()
    finally:
        os.umask(old)
    assert _mode(tmp_path / "log") == 0o750
    written = sorted((tmp_path / "log").iterdir())
    assert [p.name for p in written] == ["cuzk.log", "cuzk.log.1", "cuzk.log.2"]
    assert {_mode(p) for p in written} == {0o640}


def test_a_fifo_or_a_link_at_the_log_path_is_a_write_error_not_a_hang(tmp_path):
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    outcome: list[object] = []

    def open_it():
        try:
            RotatingLineFile(fifo, max_bytes=4096, backups=1)
        except files.WriteError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=open_it, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "opening the log blocked on a FIFO"
    assert "not a regular file (a FIFO)" in str(outcome[0])
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    (tmp_path / "link.log").symlink_to(outside)
    with pytest.raises(files.WriteError, match="symbolic link"):
        RotatingLineFile(tmp_path / "link.log", max_bytes=4096, backups=1)
    assert outside.read_bytes() == b"precious"


def test_a_full_disk_sets_the_file_aside_and_it_resumes_with_a_note(tmp_path):
    now = [0.0]
    with full_tmpfs(tmp_path / "log") as folder:
        out = RotatingLineFile(folder / "cuzk.log", max_bytes=1 << 20, backups=1,
                               clock=lambda: now[0])  # fmt: skip
        with capture_logs() as logs:
            out.write_lines([b"first\n"])  # no exception: the pump must keep reading
            out.write_lines([b"second\n", b"third\n"])
        assert not out.writable
        warnings = [e for e in logs if e["event"] == "childlog.unwritable"]
        assert len(warnings) == 1, logs
        assert "No space left on device" in warnings[0]["reason"]
        assert out.lines_dropped == 3
        make_room(folder)
        now[0] += RotatingLineFile.RETRY_S - 1
        out.write_lines([b"too early\n"])
        assert not out.writable
        now[0] += 2
        with capture_logs() as logs:
            out.write_lines([b"back\n"])
        assert out.writable
        assert [e["event"] for e in logs] == ["childlog.resumed"]
        out.close()
        text = (folder / "cuzk.log").read_text()
        assert "4 lines not written here: [Errno 28] No space left on device" in text
        assert text.endswith("back\n")
