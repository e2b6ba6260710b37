"""Child output: ANSI stripped, every line kept whole, rotation between lines, bounded events."""

import asyncio

from supervisor.childlog import OutputPump, RotatingLineFile, strip_ansi


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
