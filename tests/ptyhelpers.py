"""A program on a pseudo-terminal, and what a person sees of it: the terminal view's tests."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time

COLUMNS, ROWS = 120, 50
_CSI = re.compile(r"\x1b\[([0-9;?]*)([ -/]*)([@-~])")
_OSC = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def emulate(data: str, width: int = COLUMNS) -> list[str]:
    """What a terminal shows after ``data`` (scrollback included): text, CR, LF, backspace, cursor
    up/down/column, erase in line; colours and modes are ignored."""
    rows: list[list[str]] = [[]]
    row = col = 0
    i = 0
    while i < len(data):
        ch = data[i]
        if ch == "\x1b":
            if (m := _CSI.match(data, i)) is not None:
                params, final = m.group(1), m.group(3)
                n = int(params) if params.isdigit() else 1
                if final == "A":
                    row = max(0, row - n)
                elif final == "B":
                    row += n
                elif final == "G":
                    col = n - 1
                elif final == "K":
                    line = rows[row] if row < len(rows) else []
                    mode = int(params or 0)
                    if mode == 2:
                        line.clear()
                    elif mode == 0:
                        del line[col:]
                i = m.end()
            elif (m := _OSC.match(data, i)) is not None:
                i = m.end()
            else:
                i += 2
            while len(rows) <= row:
                rows.append([])
            continue
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row += 1
        elif ch == "\b":
            col = max(0, col - 1)
        elif ch >= " ":
            if col >= width:
                row, col = row + 1, 0
            while len(rows) <= row:
                rows.append([])
            line = rows[row]
            line.extend(" " * (col - len(line)))
            if col < len(line):
                line[col] = ch
            else:
                line.append(ch)
            col += 1
        while len(rows) <= row:
            rows.append([])
        i += 1
    shown = ["".join(r).rstrip() for r in rows]
    while shown and not shown[-1]:
        shown.pop()
    return shown


def clean_env() -> dict[str, str]:
    drop = ("CUZK_SUPERVISOR_", "CUZK_SIM_", "NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["TERM"] = "xterm-256color"
    return env


def run_on_a_terminal(command: list[str], timeout_s: float = 120) -> tuple[int, str]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    proc = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=clean_env(),
                            start_new_session=True)  # fmt: skip
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait()
        os.close(master)
    return code, b"".join(chunks).decode("utf-8", "replace")
