"""A light entrypoint (issue 16.6): each command imports only what it uses, and ``run`` and
``sim`` end without the interpreter's teardown once everything is settled, their exit code and
last lines intact."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from ptyhelpers import clean_env, emulate
from simhelpers import demo_sim, free_tcp_port, poll_until

from cuzk_supervisor import runtime
from cuzk_supervisor.cli import main as cli
from cuzk_supervisor.cli import observe
from cuzk_supervisor.cli.parser import CommandParser

REPO = Path(__file__).resolve().parents[1]
# Loaded only by the commands that use them.
HEAVY = (
    "grpc",
    "google.protobuf",
    "prometheus_client",
    "httpx",
    "rich",
    "cuzk_supervisor.lifecycle",
)
OTHER_COMMANDS = tuple(f"cuzk_supervisor.cli.commands.{c.name}" for c in cli.COMMANDS)
_LOADED = """\
import runpy, sys
sys.argv = ["cuzk-supervisor", *sys.argv[1:]]
try:
    runpy.run_module("cuzk_supervisor", run_name="__main__")
except SystemExit:
    pass
sys.stdout.flush()
sys.stderr.write("\\nLOADED " + " ".join(sorted(sys.modules)) + "\\n")
"""


def loaded_by(*argv: str) -> set[str]:
    """The modules ``cuzk-supervisor ARGV`` loads, in a fresh interpreter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUZK_SUPERVISOR_")}
    done = subprocess.run([sys.executable, "-c", _LOADED, *argv], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=60, check=False)  # fmt: skip
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("LOADED "), done.stderr[-2000:]
    return set(last.split()[1:])


def among(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return [p for p in packages if any(m == p or m.startswith(p + ".") for m in modules)]


# --- what each command imports -------------------------------------------------------------------


def test_each_listed_help_line_is_the_command_s_own() -> None:
    for command in cli.COMMANDS:
        parser = CommandParser(prog="x")
        sub = parser.add_subparsers()
        importlib.import_module(command.module).register(sub)
        (choice,) = (a for a in sub._choices_actions if a.dest == command.name)
        assert choice.help == command.help, command.name


def test_the_top_level_help_lists_every_command_and_imports_none() -> None:
    whole = {a.dest: a.help for a in _subparsers(cli.build_parser())._choices_actions}
    listed = {a.dest: a.help for a in _subparsers(cli.build_parser(()))._choices_actions}
    assert listed == whole
    assert among(loaded_by("--help"), OTHER_COMMANDS) == []


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


@pytest.mark.parametrize(
    "argv",
    [("--help",), ("config",), ("healthcheck", "--help"), ("doctor", "--help"), ("plan", "--help"),
     ("daemon", "--help"), ("sim", "--help"), ("run", "--help"), ("prove", "--help")],
)  # fmt: skip
def test_help_and_the_light_commands_load_no_heavy_part(argv: tuple[str, ...]) -> None:
    modules = loaded_by(*argv)
    assert among(modules, HEAVY) == [], argv
    given = f"cuzk_supervisor.cli.commands.{argv[0]}"
    assert among(modules, tuple(m for m in OTHER_COMMANDS if m != given)) == [], argv


@pytest.mark.parametrize("argv", [("--help",), ("config",), ("healthcheck", "--help")])
def test_commands_that_do_not_log_do_not_load_structlog(argv: tuple[str, ...]) -> None:
    assert among(loaded_by(*argv), ("structlog", "asyncio")) == [], argv


def imported_by(*modules: str) -> set[str]:
    """The modules ``import MODULES`` loads, in a fresh interpreter."""
    code = f"import sys, {', '.join(modules)}; print(' '.join(sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=60, check=True)  # fmt: skip
    return set(done.stdout.split())


# What the lifecycle loads (the proving client, the manager client, the metrics, the checks).
LIFECYCLE_ONLY = (
    "grpc", "google.protobuf", "httpx", "prometheus_client", "tenacity", "cuzk_supervisor.proto",
    "cuzk_supervisor.lifecycle", "cuzk_supervisor.cli.doctor", "cuzk_supervisor.cli.prestart",
)  # fmt: skip


def test_run_s_module_loads_no_other_command_and_not_the_lifecycle() -> None:
    """``run --help`` and ``sim --help`` import it: the lifecycle only once ``run`` runs."""
    others = tuple(m for m in OTHER_COMMANDS if not m.endswith(".run"))
    modules = imported_by("cuzk_supervisor.cli.commands.run")
    assert among(modules, (*others, "rich")) == []
    assert among(modules, LIFECYCLE_ONLY) == []


def test_the_check_before_run_loads_neither_doctor_nor_a_client() -> None:
    modules = imported_by("cuzk_supervisor.cli.prestart")
    assert among(modules, ("cuzk_supervisor.cli.doctor", "httpx", "grpc", "tenacity")) == []


def test_plan_and_daemon_load_no_grpc() -> None:
    """They use the composition root's probes and the settings' policies but never prove."""
    proving = ("grpc", "google.protobuf", "tenacity", "prometheus_client")
    daemon = imported_by("cuzk_supervisor.cli.commands.daemon", "cuzk_supervisor.compose")
    assert among(daemon, proving) == []
    assert among(loaded_by("plan"), proving) == []  # the whole command, whatever it answers


def test_prove_s_help_figures_are_the_proto_derived_ones() -> None:
    from cuzk_supervisor.adapters.proving.proofinput import PROOF_KINDS
    from cuzk_supervisor.cli.commands import prove, proveprogress

    kinds = prove.HELP_PROOF_KINDS  # what --help lists
    assert kinds == tuple(PROOF_KINDS)
    assert prove.HELP_PROGRESS_INTERVAL_S == proveprogress.PROGRESS_INTERVAL_S
    help_text = subprocess.run([sys.executable, "-m", "cuzk_supervisor", "prove", "--help"],
                               capture_output=True, text=True, cwd=REPO, env=clean_env(),
                               timeout=60, check=True).stdout  # fmt: skip
    assert ", ".join(PROOF_KINDS) in " ".join(help_text.split())
    assert f"every {proveprogress.PROGRESS_INTERVAL_S:g} s" in " ".join(help_text.split())


def _public(cls: type) -> dict[str, inspect.Signature | None]:
    return {
        name: None if isinstance(value, property) else inspect.signature(value)
        for name, value in vars(cls).items()
        if not name.startswith("_")
    }


def test_no_metrics_has_the_updates_of_the_real_ones() -> None:
    """The stand-in ``run`` uses with the health server off: every update the lifecycle can make
    on ``SupervisorMetrics``, with the same signature (``render`` is the health server's)."""
    from cuzk_supervisor.serve.metrics import SupervisorMetrics
    from cuzk_supervisor.serve.metricsink import MetricsSink, NoMetrics

    real = _public(SupervisorMetrics)
    del real["render"]
    assert _public(NoMetrics) == real
    assert _public(MetricsSink) == real
    stand_in = NoMetrics()
    stand_in.set_phase("bench")
    stand_in.proof_finished(True, 1.0)
    assert stand_in.phase == "bench"


def test_structlog_imported_after_the_package_still_does_without_rich() -> None:
    code = textwrap.dedent("""\
        import sys
        import cuzk_supervisor
        assert "structlog" not in sys.modules
        import structlog, structlog.dev
        assert "rich" not in sys.modules and structlog.dev.rich is None
        import rich  # the terminal view can still load it
        print("ok")
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=60, check=False)  # fmt: skip
    assert done.stdout.strip() == "ok", done.stderr


def test_the_simulated_daemon_loads_none_of_the_supervisors_libraries() -> None:
    """The sim daemon starts two or three times per lifecycle (every test that runs one): the
    supervisor's logging, HTTP, retry and process libraries, and its lifecycle, cost it about
    40 ms of CPU each start for nothing."""
    code = "import sys, cuzk_supervisor.sim.daemon.main; print(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=60, check=False)  # fmt: skip
    modules = set(done.stdout.split())
    assert "cuzk_supervisor.sim.daemon.engine" in modules, done.stderr
    libraries = ("structlog", "psutil", "httpx", "tenacity", "pynvml", "prometheus_client")
    assert among(modules, (*libraries, "cuzk_supervisor.lifecycle", "importlib.abc")) == []


# --- the end without the teardown ---------------------------------------------------------------

_END = """\
import logging, sys, threading
from cuzk_supervisor import runtime
out = open(sys.argv[1], "w")  # buffered, never flushed nor closed here
out.write("file line\\n")
handler = logging.FileHandler(sys.argv[2])
logging.getLogger().addHandler(handler)
logging.getLogger().warning("log line")
print("stdout line")  # a pipe: block-buffered
if sys.argv[3] == "thread":
    stop = threading.Event()
    threading.Thread(target=stop.wait, name="writer", daemon=True).start()
    print("unsettled:", runtime.unsettled())
runtime.end_settled(7)
print("returned")
stop.set()
sys.exit(5)
"""


@pytest.mark.parametrize("mode", ["settled", "thread"])
def test_end_settled_flushes_everything_and_keeps_the_code(tmp_path: Path, mode: str) -> None:
    data, log = tmp_path / "data.txt", tmp_path / "log.txt"
    argv = [sys.executable, "-c", _END, str(data), str(log), mode]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=60, check=False)
    assert data.read_text() == "file line\n"
    assert log.read_text() == "log line\n"
    if mode == "settled":
        assert (done.returncode, done.stdout) == (7, "stdout line\n")
    else:  # something still runs: it returns, and the exit is the ordinary one
        assert done.returncode == 5
        assert done.stdout == "stdout line\nunsettled: threads still running: writer\nreturned\n"


def test_a_child_left_is_not_settled() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        assert runtime.child_left()
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(30)
    assert child.returncode == 0


# --- SIGTERM in the run phase: 143, every last line whole ---------------------------------------


def _sim(sim_dir: Path) -> list[str]:
    return [sys.executable, "-m", "cuzk_supervisor", "sim", "--fresh", "--sim-dir", str(sim_dir),
            "--health-listen", f"127.0.0.1:{free_tcp_port()}", "--bench-count", "2",
            *demo_sim()]  # fmt: skip


def _wait_for(
    check: Callable[[], bool], timeout_s: float, what: str, proc: subprocess.Popen[bytes]
) -> None:
    """Until ``check`` holds, failing at once if the process exits first."""
    poll_until(lambda: check() or proc.poll() is not None, timeout_s, interval=0.1, what=what)
    assert proc.poll() is None or check(), f"exited {proc.returncode} before {what}"


def _sigterm_in_the_run_phase(proc: subprocess.Popen[bytes], err: Path) -> int:
    """SIGTERM once the events on ``err`` reach the run phase; the exit code (killed if the
    test fails before it ends)."""
    try:
        _wait_for(lambda: '"phase": "run"' in err.read_text(), 180, "run phase", proc)
        proc.send_signal(signal.SIGTERM)
        return proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_sigterm_in_the_run_phase_ends_143_with_the_last_lines_whole(tmp_path: Path) -> None:
    """Off a terminal: the JSON events on stderr, sim's own lines on stdout (a pipe, so
    block-buffered: its last line is only there if it was flushed before the exit)."""
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(_sim(tmp_path / "sim"), stdout=stdout, stderr=stderr,
                                stdin=subprocess.DEVNULL, env=clean_env(), cwd=REPO)  # fmt: skip
        code = _sigterm_in_the_run_phase(proc, err)
    assert code == 128 + signal.SIGTERM
    text = err.read_text()
    assert text.endswith("\n")
    events = [json.loads(line) for line in text.splitlines()]  # every line whole
    assert events[-1]["event"] == "supervisor.stopping"
    assert events[-1]["signal"] == "SIGTERM"
    last = out.read_text().splitlines(keepends=True)[-1]
    assert last.startswith("sim: finished with exit code 143 after ")
    assert last.endswith("s\n")


_NO_PROMETHEUS = """\
import runpy, sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "prometheus_client":
            sys.stderr.write("IMPORTED prometheus_client\\n")
            raise ImportError("prometheus_client: /metrics is serve.exposition's")
sys.meta_path.insert(0, Refuse())
sys.argv = ["cuzk-supervisor", *sys.argv[1:]]
runpy.run_module("cuzk_supervisor", run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize("health", ["true", "false"])
def test_a_run_never_loads_prometheus_client(tmp_path: Path, health: str) -> None:
    """``/metrics`` is written by ``serve.exposition`` (the library is a test dependency only,
    to parse it): ``sim`` (the whole lifecycle) to the run phase and the stop, with the health
    server on and off, any import of prometheus_client refused and reported."""
    err = tmp_path / "err.txt"
    argv = [sys.executable, "-c", _NO_PROMETHEUS, *_sim(tmp_path / "sim")[3:]]
    env = {**clean_env(), "CUZK_SUPERVISOR_HEALTH_ENABLED": health}
    with err.open("wb") as stderr:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr,
                                stdin=subprocess.DEVNULL, env=env, cwd=REPO)  # fmt: skip
        code = _sigterm_in_the_run_phase(proc, err)
    text = err.read_text()
    assert "IMPORTED prometheus_client" not in text
    assert code == 128 + signal.SIGTERM, text[-2000:]


@pytest.mark.slow
def test_sigterm_on_a_terminal_ends_143_with_the_summary_and_the_events_file_whole(
    tmp_path: Path,
) -> None:
    """On a terminal: the view's closing summary on it, the JSON events in the events file."""
    import pty

    events_file = tmp_path / "sim" / "log" / observe.EVENTS_FILE
    master, slave = pty.openpty()
    proc = subprocess.Popen(_sim(tmp_path / "sim"), stdin=slave, stdout=slave, stderr=slave,
                            env=clean_env(), cwd=REPO, start_new_session=True)  # fmt: skip
    os.close(slave)
    chunks: list[bytes] = []
    try:
        os.set_blocking(master, False)

        def drained_and(check: Callable[[], object]) -> bool:
            try:
                while chunk := os.read(master, 65536):
                    chunks.append(chunk)
            except (BlockingIOError, OSError):
                pass
            return bool(check())

        def in_run() -> bool:
            return events_file.exists() and '"phase": "run"' in events_file.read_text()

        _wait_for(lambda: drained_and(in_run), 180, "run phase", proc)
        proc.send_signal(signal.SIGTERM)
        poll_until(lambda: drained_and(lambda: proc.poll() is not None), 60, interval=0.05,
                   what="the exit after SIGTERM")  # fmt: skip
        code = proc.wait(5)
        drained_and(lambda: True)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    assert code == 128 + signal.SIGTERM
    shown = emulate(b"".join(chunks).decode("utf-8", "replace"))
    assert any(line.startswith(" exit   143") for line in shown), "\n".join(shown)
    text = events_file.read_text()
    assert text.endswith("\n")
    last = json.loads(text.splitlines()[-1])
    assert (last["event"], last["signal"]) == ("supervisor.stopping", "SIGTERM")
