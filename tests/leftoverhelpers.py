"""A fetch command that notices a second copy of itself, and cleanup of marked children."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import psutil

from cuzk_supervisor.daemon import leftovers

_FETCH = """
import os, sys, time
import psutil
journal, pause, chunks, escape = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sizes = dict((n, int(s)) for n, _, s in (a.rpartition(":") for a in sys.argv[5:]))
lock = "fetch.lock"
def note(text):
    with open(journal, "a") as out:
        out.write(text + "\\n")
def holder_alive():
    try:
        pid = int(open(lock).read())
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (OSError, ValueError, psutil.Error):
        return False
try:
    fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
except FileExistsError:
    if holder_alive():
        note("overlap %d" % os.getpid())
    fd = os.open(lock, os.O_WRONLY | os.O_TRUNC)
os.write(fd, str(os.getpid()).encode()); os.close(fd)
note("start %d" % os.getpid())
if escape == "escape":
    # A grandchild in a session of its own: no pidfile or process group finds it.
    import subprocess
    subprocess.Popen(["setsid", sys.executable, "-c", "import time; time.sleep(300)"])
for name, size in sizes.items():
    piece = name.encode() * (size // len(name) + 1)
    with open(name, "wb") as f:
        step = size // chunks
        for i in range(chunks):
            f.write(piece[i * step:(i + 1) * step]); f.flush(); time.sleep(pause)
        f.write(piece[chunks * step:size])
    print("fetched", name, flush=True)
os.unlink(lock)
note("end %d" % os.getpid())
"""


def careful_fetch_command(
    tmp_path: Path, sizes: dict[str, int], pause: float, chunks: int = 20, escape: bool = False
) -> str:
    """A fetch command writing ``sizes`` slowly; it writes ``overlap`` to the journal when it
    starts while another copy of it is still running (the bug), ``start``/``end`` otherwise."""
    script = tmp_path / "careful_fetch.py"
    script.write_text(_FETCH)
    specs = " ".join(f"{name}:{size}" for name, size in sizes.items())
    mode = "escape" if escape else "stay"
    return f"{sys.executable} {script} {journal(tmp_path)} {pause} {chunks} {mode} {specs}"


def journal(tmp_path: Path) -> Path:
    return tmp_path / "fetch-journal"


def journal_lines(tmp_path: Path) -> list[str]:
    path = journal(tmp_path)
    return path.read_text().split("\n")[:-1] if path.exists() else []


def files_whole(folder: Path, sizes: dict[str, int]) -> bool:
    for name, size in sizes.items():
        expected = (name.encode() * (size // len(name) + 1))[:size]
        if (folder / name).read_bytes() != expected:
            return False
    return True


def marked(role: str) -> list[psutil.Process]:
    """Live processes carrying ``role`` in their environment (whoever started them)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(leftovers.ROLE_VAR) == role:
                found.append(proc)
    return found


def kill_marked(role: str) -> None:
    for proc in marked(role):
        with contextlib.suppress(psutil.Error):
            proc.kill()
