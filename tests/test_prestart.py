"""Issue 13, item 3 and 4: every setting bounded, every input file checked, before anything starts.

The table runs the real command line (``cuzk-supervisor config``, in-process for speed: the same
``cli.main`` the entry point calls) for every setting × {empty, negative, huge, NaN, ±inf, an
over-long unix socket, non-UTF-8, 100 KB}: exit 2 with a one-line error naming the setting, or an
acceptance documented in ``ACCEPTED`` below; the paths are then held, in ``check_before_start``,
to what they must point at (missing, a folder, a FIFO, unreadable, empty).
``test_prestart_e2e.py`` runs ``run`` end to end for a smaller set and shows nothing is
registered.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fshelpers import bytes_read

from cuzk_supervisor import exitcodes, settings
from cuzk_supervisor.adapters import inputfile
from cuzk_supervisor.adapters.inputfile import read_bytes, read_text
from cuzk_supervisor.adapters.proving.proofinput import C1_MAX_BYTES, load_c1
from cuzk_supervisor.adapters.state.doc import SupervisorState
from cuzk_supervisor.cli import main as cli
from cuzk_supervisor.cli import prestart
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.sim.machine import probes as sim_probes

DECLS = settings.declarations()

CASES = {
    "empty": "",
    "negative": "-1",
    "huge": "1000000000000000000",
    "huge_float": "1e18",
    "nan": "nan",
    "inf": "inf",
    "minus_inf": "-inf",
    # Over the kernel's 108-byte sun_path: no socket can be bound there.
    "unix_too_long": "unix:///" + "s" * 120,
    "non_utf8": "\udcff",  # how Python shows the byte 0xff of an environment variable
    "100kb": "x" * 100_000,
}

_TEXT_AS_NAME = "valid text for this setting (a label, a relative path, a name or an argument)"
# Each accepted (setting, case), and why: what is left is refused with exit 2.
ACCEPTED: dict[tuple[str, str], str] = {}


def _accept(names: tuple[str, ...], cases: tuple[str, ...], why: str) -> None:
    for name in names:
        for case in cases:
            ACCEPTED[(name, case)] = why


_BOOLS = tuple(d.name for d in DECLS if d.kind == "bool")
_PATHS = tuple(d.name for d in DECLS if d.kind in ("path", "optional_path"))
_accept(_BOOLS, ("empty",), "an empty switch is false (as for an unset flag)")
_accept(
    ("label", "manager_url", "manager_token", "daemon_listen", "params_fetch_command"),
    ("empty",),
    "empty is the documented 'not set' (VAST_CONTAINERLABEL, local run, no token, the unix "
    "socket, no fetch)",
)
_accept(("daemon_base_config", "cgroup_root"), ("empty",), "empty is 'none' / 'discover'")
_accept(("daemon_args", "params_expected", "worker_commands"), ("empty",), "an empty list")
_WORDS = ("huge", "huge_float", "nan", "inf")
_accept(_PATHS, (*_WORDS, "unix_too_long"), _TEXT_AS_NAME)
_accept(("label",), _WORDS, _TEXT_AS_NAME)
_accept(("daemon_binary",), (*_WORDS, "unix_too_long"), _TEXT_AS_NAME)
_accept(("daemon_log_level",), ("nan", "inf"), "a word is a log filter")
_commands = (*_WORDS, "unix_too_long")
_accept(("params_fetch_command", "worker_commands"), _commands, "a shell command word")
_accept(("daemon_args",), ("negative", "minus_inf", *_commands), "a daemon argument")
_accept(("manager_token",), ("negative", "minus_inf", *_commands), "a token is opaque text")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith(settings.ENV_PREFIX) or name in ("VAST_CONTAINERLABEL", "MIN_RATE"):
            monkeypatch.delenv(name)
    return monkeypatch


def _config(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(["config", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("decl", DECLS, ids=[d.name for d in DECLS])
def test_every_setting_refuses_a_bad_value_naming_it(
    decl: settings.Declared,
    case: str,
    clean_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    clean_env.setenv(decl.env, CASES[case])
    code, err = _config(capsys)
    if (decl.name, case) in ACCEPTED:
        assert code == exitcodes.OK, err
        return
    assert code == exitcodes.USAGE, f"{decl.name}={case} accepted"
    assert err.count("\n") == 1, err  # one line
    assert decl.name in err
    assert len(err) < 400  # the value is cut short (or left out), never echoed whole
    if decl.secret or case in ("non_utf8", "100kb"):
        assert CASES[case][:20] not in err or CASES[case] == ""


def test_accepted_cases_are_all_real() -> None:
    """Each documented acceptance names a setting and a case that exist (no stale entries)."""
    names = {d.name for d in DECLS}
    assert {name for name, _ in ACCEPTED} <= names
    assert {case for _, case in ACCEPTED} <= set(CASES)


@pytest.mark.parametrize(
    ("toml", "fragment"),
    [
        ("label = 1979-05-27T07:32:00Z", "setting label"),
        ("label = 5", "setting label"),
        ('label = "C.1\\n; rm -rf /"', "setting label"),
        ("label = 'C.1; rm -rf /'", "setting label"),
        ("label = '" + "a" * 129 + "'", "setting label"),
        ("bench_count = 1e18", "setting bench_count"),
        ("bench_count = 1_000_000_000_000_000_000", "setting bench_count"),
        ("status_interval_s = 86401", "setting status_interval_s"),
        ("warmup_budget_s = inf", "setting warmup_budget_s"),
        ("manager_url = 'http://host:99999/'", "setting manager_url"),
        ("manager_url = 'http:///nohost'", "setting manager_url"),
        ('manager_token = "a\\r\\nX-Evil: 1"', "setting manager_token"),
        ("daemon_listen = 'localhost:9000'", "setting daemon_listen"),
        ("daemon_status_listen = ''", "setting daemon_status_listen"),
        ("health_listen = '127.0.0.1:http'", "bad health_listen"),
        ("daemon_args = [1, 2]", "setting daemon_args"),
        ('daemon_args = ["a\\u0000b"]', "setting daemon_args"),
        ('state_dir = "a\\u0000b"', "setting state_dir"),
        ("state_dir = '" + "n" * 300 + "'", "setting state_dir"),
        ("params_expected = ['../x.params:10']", "setting params_expected"),
        ("params_expected = ['x.params:99999999999999']", "setting params_expected"),
        ("params_fetch_command = '-c true'", "setting params_fetch_command"),
        ('worker_commands = ["sleep 1\\nrm -rf /"]', "setting worker_commands"),
        ('daemon_log_level = "info\\nX"', "setting daemon_log_level"),
        ("daemon_listen = '0.0.0.0:9000'", "daemon_listen '0.0.0.0:9000' is not a loopback"),
        ("daemon_status_listen = '[::]:9000'", "daemon_status_listen '[::]:9000' is not a"),
    ],
)
def test_bad_file_values_exit_2_in_one_line(
    toml: str,
    fragment: str,
    tmp_path: Path,
    clean_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    file = tmp_path / "s.toml"
    file.write_text(toml + "\n")
    code, err = _config(capsys, "--config-file", str(file))
    assert code == exitcodes.USAGE, err
    assert err.count("\n") == 1
    assert fragment in err


def test_a_settings_file_that_is_not_utf8_or_too_big_is_one_line(
    tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "s.toml"
    file.write_bytes(b"label = '\xff\xfe'\n")
    code, err = _config(capsys, "--config-file", str(file))
    assert (code, err.count("\n")) == (exitcodes.USAGE, 1)
    assert "settings file" in err
    assert "not UTF-8" in err
    with open(file, "wb") as handle:
        handle.truncate(2 << 30)  # sparse: refused by its size, not read
    before = bytes_read()
    code, err = _config(capsys, "--config-file", str(file))
    assert bytes_read() - before < 256 << 10  # not read (its limit is 1 MiB): refused by its size
    assert (code, err.count("\n")) == (exitcodes.USAGE, 1)
    assert "over the limit" in err
    file.write_text("a = " + "[" * 100_000)
    code, err = _config(capsys, "--config-file", str(file))
    assert (code, err.count("\n")) == (exitcodes.USAGE, 1)
    assert "nested too deep" in err
    file.write_text("bench_count = " + "9" * 5000)
    code, err = _config(capsys, "--config-file", str(file))
    assert (code, err.count("\n")) == (exitcodes.USAGE, 1)
    assert "is not valid TOML" in err
    clean_env.setenv(settings.CONFIG_FILE_ENV, "\udcff")
    code, err = _config(capsys)
    assert (code, err.count("\n")) == (exitcodes.USAGE, 1)
    assert "not valid UTF-8" in err


def test_public_daemon_listen_is_allowed_only_when_asked(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _config(capsys, "--daemon-listen", "0.0.0.0:9000")
    assert code == exitcodes.USAGE
    assert "allow_public_listen" in err
    code, err = _config(capsys, "--daemon-listen", "0.0.0.0:9000", "--allow-public-listen")
    assert code == exitcodes.OK, err
    for listen in ("127.0.0.1:9000", "[::1]:9000", "unix:///run/x.sock"):
        assert _config(capsys, "--daemon-listen", listen)[0] == exitcodes.OK
    loaded = settings.load({"daemon_listen": "0.0.0.0:9000", "allow_public_listen": "1"}, {})
    warning = settings.public_listen_warning(loaded.settings, "daemon_listen")
    assert warning is not None
    assert "reachable from the network" in warning
    local = settings.load({"daemon_listen": "127.0.0.1:9000"}, {})
    assert settings.public_listen_warning(local.settings, "daemon_listen") is None


# --- files -------------------------------------------------------------------------------


PHASE1 = base64.b64encode(b'{"registered_proof": "StackedDrg32GiBV1_1"}').decode()


def _good_c1(path: Path) -> Path:
    path.write_text(json.dumps({"SectorNum": 1, "Phase1Out": PHASE1, "SectorSize": 32 << 30}))
    return path


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"", "is empty"),
        (b"  \n", "is empty"),
        (b"not json", "is not JSON"),
        (b"\xff\xfe{}", "is not JSON"),
        (b"[" * 100_000, "is not JSON"),
        (b'{"SectorNum": 1, "SectorSize": 34359738368}', "has no Phase1Out"),
        (json.dumps({"Phase1Out": base64.b64encode(b"[1]").decode()}).encode(), "JSON object"),
        (json.dumps({"Phase1Out": base64.b64encode(b"\xff").decode()}).encode(), "JSON object"),
        (json.dumps({"Phase1Out": PHASE1, "SectorSize": 1000}).encode(), "sector size"),
        (json.dumps({"Phase1Out": PHASE1, "SectorNum": 1 << 64}).encode(), "SectorNum"),
        (b'{"Phase1Out": "eyJhIjogMX0=", "SectorNum": ' + b"9" * 5000 + b"}", "is not JSON"),
    ],
)
def test_bad_c1_is_refused_before_start(content: bytes, fragment: str, tmp_path: Path) -> None:
    path = tmp_path / "c1.json"
    path.write_bytes(content)
    with pytest.raises(UsageError) as caught:
        load_c1(path)
    assert fragment in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_oversized_sparse_c1_is_refused_by_stat_at_once(tmp_path: Path) -> None:
    path = tmp_path / "c1.json"
    with open(path, "wb") as handle:
        handle.truncate(2 << 30)  # 2 GiB, no blocks
    before = bytes_read()
    with pytest.raises(UsageError, match=r"is 2\.0 GiB, over the limit"):
        load_c1(path)
    assert bytes_read() - before < 256 << 10  # refused by its size, not read
    with open(path, "wb") as handle:
        handle.truncate(C1_MAX_BYTES + 1)  # just over: still refused
    with pytest.raises(UsageError, match="over the limit"):
        load_c1(path)


def test_a_fifo_or_folder_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path):
        with pytest.raises(UsageError, match="not a regular file"):
            read_bytes(path, what="C1 file", max_bytes=10)
    with pytest.raises(UsageError, match="No such file"):
        read_text(tmp_path / "missing", what="settings file", max_bytes=10)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"[daemon\nlisten = 1", "is not valid TOML"),
        (b"a = " + b"[" * 100_000, "nested too deep"),
        (b"a = " + b"9" * 5000, "is not valid TOML"),
        (b"[srs]\nparam_cache = '\xff'\n", "not UTF-8"),
        (b"daemon = 5\n", "daemon must be a table"),
        (b"memory = 'lots'\n", "memory must be a table"),
    ],
)
def test_bad_daemon_base_config_is_one_line(content: bytes, fragment: str, tmp_path: Path) -> None:
    path = tmp_path / "base.toml"
    path.write_bytes(content)
    with pytest.raises(UsageError) as caught:
        prestart.check_base_config(path)
    assert fragment in str(caught.value)
    assert str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_good_daemon_base_config_passes(tmp_path: Path) -> None:
    path = tmp_path / "base.toml"
    path.write_text("[gpu]\ndevices = [0, 1]\nwhen = 1979-05-27T07:32:00Z\n[daemon]\nx = 1\n")
    assert prestart.check_base_config(path)["gpu"]["devices"] == [0, 1]
    assert prestart.check_base_config(None) == {}


def _settings(tmp_path: Path, **values: str) -> settings.Settings:
    base = {
        "c1_file": str(_good_c1(tmp_path / "c1.json")),
        "health_enabled": "false",
        "daemon_binary": sys.executable,
        **{name: str(tmp_path / name) for name in prestart.FOLDERS},
    }
    return settings.load({**base, **values}, {}).settings


@dataclass(frozen=True)
class FakeDisk:
    free: int


def _room(free: int) -> Callable[[Path], FakeDisk]:
    return lambda _path: FakeDisk(free)


PLENTY = _room(1 << 50)


def test_prestart_holds_the_platform_environment_to_the_same_rules(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    assert (
        prestart.check_before_start(s, {"VAST_CONTAINERLABEL": " C.42 "}, disk_usage=PLENTY) == []
    )
    for environ, fragment in (
        ({"VAST_CONTAINERLABEL": "C.1\n$(reboot)"}, "env VAST_CONTAINERLABEL"),
        ({"VAST_CONTAINERLABEL": "x" * 200}, "env VAST_CONTAINERLABEL"),
        ({"MIN_RATE": "nan"}, "env MIN_RATE"),
        ({"MIN_RATE": "1e18"}, "env MIN_RATE"),
    ):
        with pytest.raises(UsageError, match=fragment):
            prestart.check_before_start(s, environ, disk_usage=PLENTY)


def test_prestart_returns_the_public_listen_warning(tmp_path: Path) -> None:
    s = _settings(tmp_path, daemon_status_listen="0.0.0.0:9821", allow_public_listen="true")
    (warning,) = prestart.check_before_start(s, {}, disk_usage=PLENTY)
    assert "daemon_status_listen" in warning


# --- the machine, before anything slow (issue 14.2) -------------------------------------------

GIB = 1 << 30


def test_a_daemon_binary_that_cannot_run_is_refused(tmp_path: Path) -> None:
    """Found at warmup before (after register and params: up to 90 minutes), and exit 3."""
    plain = tmp_path / "cuzk"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    for binary, fragment in (
        (str(tmp_path / "missing" / "cuzk"), "not found"),
        ("no-such-cuzk-binary", "not found on PATH"),
        (str(plain), "not executable"),
        (str(tmp_path), "not executable"),
    ):
        with pytest.raises(UsageError, match=fragment) as caught:
            prestart.check_before_start(
                _settings(tmp_path, daemon_binary=binary), {}, disk_usage=PLENTY
            )
        assert str(caught.value).startswith("setting daemon_binary: ")


@pytest.mark.parametrize("name", prestart.FOLDERS)
def test_a_folder_that_cannot_be_made_is_refused_and_nothing_is_made(
    tmp_path: Path, name: str
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a folder should be")
    s = _settings(tmp_path, **{name: str(blocker / "deep" / name)})
    with pytest.raises(UsageError) as caught:
        prestart.check_before_start(s, {}, disk_usage=PLENTY)
    assert f"setting {name}: " in str(caught.value)
    assert "cannot be made" in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker", "c1.json"]


def test_a_file_where_a_folder_should_be_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state_dir").write_text("")
    with pytest.raises(UsageError, match=r"setting state_dir: .* is not a folder"):
        prestart.check_before_start(_settings(tmp_path), {}, disk_usage=PLENTY)


def test_missing_folders_under_a_writable_parent_pass_and_are_not_made(tmp_path: Path) -> None:
    prestart.check_before_start(_settings(tmp_path), {}, disk_usage=PLENTY)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c1.json"]  # looked at, not made


def _read_only_mount(folder: Path) -> None:
    folder.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {done.stderr.decode().strip()}")


def test_an_unwritable_param_cache_is_refused(tmp_path: Path) -> None:
    """Root may write anywhere but on a read-only file system: mount one (else chmod, which
    holds for anyone else)."""
    folder = tmp_path / "ro"
    if os.geteuid() == 0:
        _read_only_mount(folder)
    else:
        folder.mkdir()
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        for cache in (folder, folder / "params"):
            s = _settings(tmp_path, daemon_param_cache=str(cache))
            with pytest.raises(UsageError, match=r"setting daemon_param_cache: .*writable"):
                prestart.check_before_start(s, {}, disk_usage=PLENTY)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", "-l", str(folder)], check=False, capture_output=True)
        else:
            folder.chmod(stat.S_IRWXU)


def test_too_little_disk_for_the_parameters_and_pce_files_is_refused(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    need = prestart.disk_needed(s, None)
    assert need == 125 * GIB  # doctor's figures: 25 GiB of PCE files + 100 GiB of parameters
    prestart.check_before_start(s, {}, disk_usage=_room(need))
    with pytest.raises(UsageError) as caught:
        prestart.check_before_start(s, {}, disk_usage=_room(need - 1))
    text = str(caught.value)
    assert text.startswith("setting daemon_param_cache: only 125 GiB free")
    assert "need 125 GiB" in text


def test_the_disk_need_counts_what_is_already_there(tmp_path: Path) -> None:
    cache = tmp_path / "daemon_param_cache"
    cache.mkdir()
    (cache / "a.params").write_bytes(b"x" * 1000)
    s = _settings(tmp_path, params_expected="a.params:1000 b.params:2000")
    assert prestart.disk_needed(s, None) == 125 * GIB - 1000
    earlier = settings_state(params_verified=True)
    assert prestart.disk_needed(s, earlier) == 25 * GIB  # the PCE files are still to come
    built = settings_state(params_verified=True, pce_ready=True)
    assert prestart.disk_needed(s, built) == 0  # a restart after the warmup needs nothing more
    simulated = _settings(tmp_path, plan_memory_scale="1024")
    assert prestart.disk_needed(simulated, None) == 125 * GIB // 1024  # simulated sizes


def settings_state(*, params_verified: bool = False, pce_ready: bool = False) -> SupervisorState:
    return SupervisorState(params_verified=params_verified, pce_ready=pce_ready)


def test_the_state_a_previous_run_left_is_read_without_touching_it(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    state_dir = tmp_path / "state_dir"
    state_dir.mkdir()
    path = state_dir / prestart.STATE_FILE
    assert prestart.previous_state(s) is None
    path.write_text(SupervisorState(params_verified=True, pce_ready=True).to_json())
    previous = prestart.previous_state(s)
    assert previous is not None
    assert previous.params_verified
    assert previous.pce_ready
    path.write_text("not json")
    assert prestart.previous_state(s) is None
    assert path.read_text() == "not json"  # not moved aside: the run does that, not the check


@pytest.mark.parametrize(
    ("args", "environ", "fragment"),
    [
        ("-m cuzk_supervisor.sim.daemon --fault bogus", {}, "unknown fault kind 'bogus'"),
        ("-m cuzk_supervisor.sim.daemon", {"CUZK_SIM_FAULTS": "oom"}, "needs an argument"),
        ("-m cuzk_supervisor.sim.daemon --gpus 0", {}, "--gpus must be >= 1"),
        ("-m cuzk_supervisor.sim.daemon --cgroup-dir /nonexistent/cg", {}, "no such directory"),
        (
            "-m cuzk_supervisor.sim.daemon",
            {"CUZK_SIM_CGROUP_DIR": "/nonexistent/cg"},
            "--cgroup-dir /nonexistent/cg: no such directory",
        ),
    ],
)
def test_what_the_simulated_daemon_would_refuse_is_refused_now(
    tmp_path: Path, args: str, environ: dict[str, str], fragment: str
) -> None:
    s = _settings(tmp_path, daemon_args=args)
    machine = sim_probes.machine(environ)  # what `run` is handed (cli.simhandoff.machine_for)
    with pytest.raises(UsageError, match=fragment):
        prestart.check_before_start(s, environ, disk_usage=PLENTY, machine=machine)
    # The same switches for another daemon are that daemon's business.
    other = _settings(tmp_path, daemon_args="--fault bogus")
    prestart.check_before_start(other, environ, disk_usage=PLENTY, machine=machine)


# --- the paths: what each must point at -------------------------------------------------------


def _unreadable(tmp_path: Path) -> Path:
    path = _good_c1(tmp_path / "unreadable")
    path.chmod(0)
    return path


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


PATH_CASES: dict[str, Callable[[Path], Path]] = {
    "missing": lambda t: t / "absent",
    "folder": lambda t: t,  # a folder where a file is wanted
    "fifo": _fifo,
    "unreadable": _unreadable,
    "empty": lambda t: _file_at(t / "empty", b""),
}


def _file_at(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


# (setting, case) refused by check_before_start: input files must be readable and not empty;
# folders must be folders (a missing one is made, an unreadable file is not a folder either).
# An empty daemon base config is an empty TOML table: nothing to merge, taken.
FILE_SETTINGS = ("c1_file", "daemon_base_config", "daemon_binary")
PATH_REFUSED = [
    (name, case)
    for name in FILE_SETTINGS
    for case in PATH_CASES
    if (name, case) != ("daemon_base_config", "empty")
] + [(name, case) for name in prestart.FOLDERS for case in ("fifo", "unreadable", "empty")]


@pytest.mark.parametrize(("name", "case"), PATH_REFUSED)
def test_every_path_that_cannot_work_is_refused_naming_its_setting(
    name: str, case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bad").mkdir()
    target = PATH_CASES[case](tmp_path / "bad")
    # Root reads a mode-0 file (a mode-0 binary still cannot run): as root, the open of that file
    # answers what the kernel answers any other user, EACCES.
    if case == "unreadable" and name in ("c1_file", "daemon_base_config") and os.geteuid() == 0:
        real_open = inputfile.os.open

        def denied(path: Any, *args: Any, **kwargs: Any) -> int:
            if Path(path) == target:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(inputfile.os, "open", denied)
    s = _settings(tmp_path, **{name: str(target)})
    with pytest.raises(UsageError) as caught:
        prestart.check_before_start(s, {}, disk_usage=PLENTY)
    assert f"setting {name}" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_run_dir_too_long_for_the_daemons_socket_is_refused(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 200)
    with pytest.raises(UsageError, match=r"setting run_dir: .*over the kernel's limit of 107"):
        prestart.check_before_start(_settings(tmp_path, run_dir=str(deep)), {}, disk_usage=PLENTY)


@pytest.mark.parametrize("name", ["daemon_listen", "daemon_status_listen"])
def test_a_unix_socket_path_over_the_kernel_limit_is_refused(name: str, tmp_path: Path) -> None:
    fits = "unix:///" + "s" * 106  # 107 bytes with its leading slash: the most that binds
    _settings(tmp_path, **{name: fits})
    with pytest.raises(UsageError, match=rf"setting {name} .*108 bytes, over the kernel's"):
        _settings(tmp_path, **{name: fits + "s"})
