"""Daemon-style log lines: tracing's layout, always coloured, RUST_LOG parsing."""

from __future__ import annotations

import io
import re

from cuzk_supervisor.sim.daemon import logfmt


def test_line_layout_matches_the_real_daemon() -> None:
    line = logfmt.format_line(
        "info",
        "cuzk_daemon",
        "cuzk-daemon ready, serving on 127.0.0.1:9000",
        {},
        "2026-11-29T16:00:00.123456Z",
    )
    assert "\x1b[2m2026-11-29T16:00:00.123456Z\x1b[0m" in line  # dim timestamp
    assert "\x1b[32m INFO\x1b[0m" in line  # green, right-aligned level
    assert logfmt.strip_ansi(line) == (
        "2026-11-29T16:00:00.123456Z  INFO cuzk_daemon: "
        "cuzk-daemon ready, serving on 127.0.0.1:9000\n"
    )


def test_fields_render_as_key_value() -> None:
    line = logfmt.format_line("warn", "t", "m", {"elapsed_ms": 45000, "msg": "two words"}, "ts")
    assert logfmt.strip_ansi(line) == 'ts  WARN t: m elapsed_ms=45000 msg="two words"\n'


def test_level_filter_and_colour_even_off_a_terminal() -> None:
    out = io.BytesIO()
    log = logfmt.DaemonLog("info", out)
    log.debug("t", "hidden")
    log.info("t", "shown")
    text = out.getvalue().decode()
    assert "hidden" not in text
    assert re.search(r"\x1b\[32m INFO\x1b\[0m .*shown", text)


def test_rust_log_directives() -> None:
    assert logfmt.level_from_rust_log("debug") == "debug"
    assert logfmt.level_from_rust_log("warn,cuzk_core=trace") == "trace"
    assert logfmt.level_from_rust_log("h2=debug,info") == "info"
    assert logfmt.level_from_rust_log("WARNING") == "warn"
    assert logfmt.level_from_rust_log("") is None
    assert logfmt.level_from_rust_log("h2=debug") is None
