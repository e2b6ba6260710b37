"""Deployment files keep their contract: Dockerfile, .dockerignore, on-start hook, Kubernetes.

No Docker engine here: the Dockerfile is parsed and its promises checked (entrypoint, stop
signal, health check, base image argument, no secrets), its health check command is run against
a local HTTP server, and the wheel is built from exactly the context .dockerignore lets through.
The on-start hook runs for real against a stand-in supervisor. The manifest is read with PyYAML.
The linters themselves (hadolint, kubernetes-validate, shellcheck) run in .ci/lint-deploy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.server
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from pacehelpers import patient
from simhelpers import poll_until

from cuzk_supervisor import settings

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
ONSTART = ROOT / "deploy" / "onstart.sh"
MANIFEST = ROOT / "deploy" / "kubernetes" / "cuzk-supervisor.yaml"
LINT = ROOT / ".ci" / "lint-deploy"

DEFAULTS = settings.Settings()
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|PRIVATE|AUTH", re.IGNORECASE)
DECLARED_ENV = {decl.env for decl in settings.declarations()}


# --- Dockerfile ----------------------------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: continuations joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # Docker drops comment lines, also inside a continuation
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        name, _, args = buf.partition(" ")
        out.append((name.upper(), args.strip()))
        buf = ""
    assert not buf, "Dockerfile ends inside a continuation"
    return out


def stages(instrs: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instrs:
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def env_pairs(args: str) -> dict[str, str]:
    pairs = {}
    for word in shlex.split(args):
        key, sep, value = word.partition("=")
        assert sep, f"ENV {args!r}: use the KEY=VALUE form"
        pairs[key] = value
    return pairs


def duration_s(text: str) -> float:
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text):
        total += float(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


def healthcheck(final: list[tuple[str, str]]) -> tuple[dict[str, str], list[str]]:
    (args,) = [a for name, a in final if name == "HEALTHCHECK"]
    options, sep, command = args.partition(" CMD ")
    assert sep, "HEALTHCHECK needs a CMD"
    opts = dict(word.lstrip("-").split("=", 1) for word in options.split())
    return opts, json.loads(command)


@pytest.fixture(scope="module")
def docker() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def final(docker: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return stages(docker)[-1]


def test_builds_with_no_frontend_image_and_labels_version_and_revision(docker, final):
    text = DOCKERFILE.read_text()
    # A `# syntax=` directive makes BuildKit fetch a frontend image: no build offline.
    assert not re.search(r"^#\s*syntax\s*=", text, re.MULTILINE | re.IGNORECASE)
    assert not [a for n, a in docker if n == "RUN" and "--mount" in a], "classic builder too"
    labels = " ".join(a for n, a in final if n == "LABEL")
    assert 'org.opencontainers.image.version="${VERSION}"' in labels
    assert 'org.opencontainers.image.revision="${REVISION}"' in labels
    args = dict(a.partition("=")[::2] for n, a in final if n == "ARG")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert args["VERSION"] == project["version"], "VERSION's default is the project's version"


def test_base_image_is_a_build_argument_used_by_every_stage(docker):
    before_from = docker[: next(i for i, (n, _) in enumerate(docker) if n == "FROM")]
    args = dict(a.partition("=")[::2] for n, a in before_from if n == "ARG")
    assert "CUZK_BASE_IMAGE" in args, "ARG CUZK_BASE_IMAGE must come before the first FROM"
    assert re.fullmatch(r"python:3\.1[1-9][\w.-]*", args["CUZK_BASE_IMAGE"]), (
        "the default base must be an official Python >= 3.11 image (sim runs without a GPU)"
    )
    froms = [a for n, a in docker if n == "FROM"]
    assert len(froms) >= 2, "multi-stage: a builder and a runtime"
    for args_ in froms:
        assert args_.split()[0] == "${CUZK_BASE_IMAGE}", f"FROM {args_}: same base everywhere"


def test_runtime_contract(final):
    def one(name: str) -> str:
        found = [a for n, a in final if n == name]
        assert len(found) == 1, f"the final stage needs exactly one {name}"
        return found[0]

    assert json.loads(one("ENTRYPOINT")) == ["cuzk-supervisor"]
    assert json.loads(one("CMD")) == ["run"]
    assert one("STOPSIGNAL") == "SIGTERM"
    assert not [a for n, a in final if n == "EXPOSE"], "nothing public by default"
    env: dict[str, str] = {}
    for n, a in final:
        if n == "ENV":
            env |= env_pairs(a)
    assert env.get("PYTHONUNBUFFERED") == "1"
    # The runtime stage takes nothing from the build context (the wheels come from the builder)
    # but the on-start hook, at the path the manager's deploy runs (manager-api.md, "Deploy").
    from_context = [a for n, a in final if n in ("COPY", "ADD") and "--from=" not in a]
    assert from_context == ["deploy/onstart.sh /usr/local/bin/entrypoint.sh"]


def test_env_settings_are_declared_valid_and_on_the_data_volume(final):
    env: dict[str, str] = {}
    for n, a in final:
        if n == "ENV":
            env |= env_pairs(a)
    ours = {k: v for k, v in env.items() if k.startswith(settings.ENV_PREFIX)}
    assert set(ours) <= DECLARED_ENV, f"unknown settings: {set(ours) - DECLARED_ENV}"
    loaded = settings.load({}, environ=ours).settings
    assert loaded.state_dir.is_relative_to("/data"), "state must be on the persistent volume"
    # `sim` redirects only settings left at their defaults to its own folder and manager: an
    # image ENV for these would point the simulator at the real ones.
    for name in ("c1_file", "daemon_param_cache", "manager_url", "manager_token"):
        assert f"{settings.ENV_PREFIX}{name.upper()}" not in ours, name


def test_no_secret_in_any_layer(docker):
    for name, args in docker:
        if name == "ARG":
            keys = [args.partition("=")[0]]
        elif name == "ENV":
            keys = list(env_pairs(args))
        else:
            continue
        for key in keys:
            assert not SECRET_NAME.search(key), f"{name} {key}: secrets are given at run time"
    text = DOCKERFILE.read_text()
    assert not re.search(r"--mount=type=secret|://[^/\s:@]+:[^/\s@]+@", text)


def test_healthcheck_runs_the_healthcheck_command_with_a_long_start_period(final):
    opts, command = healthcheck(final)
    assert duration_s(opts["start-period"]) >= 30 * 60, "params + warmup come first"
    assert 0 < duration_s(opts["timeout"]) < duration_s(opts["interval"])
    # The supervisor's own command (no curl): it reads health_listen as run and sim do.
    assert command == ["cuzk-supervisor", "healthcheck"]


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200
    paths: list[str] = []  # noqa: RUF012 (a class-level log of the requests, reset per test)

    def do_GET(self) -> None:
        type(self).paths.append(self.path)
        self.send_response(type(self).status)
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server():
    _Health.paths = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def run_healthcheck(command: list[str], listen: str | None) -> subprocess.CompletedProcess[str]:
    """The HEALTHCHECK's command as Docker runs it (the venv's entry point = python -m)."""
    assert command[0] == "cuzk-supervisor"
    env = {k: v for k, v in os.environ.items() if not k.startswith(settings.ENV_PREFIX)}
    if listen is not None:
        env["CUZK_SUPERVISOR_HEALTH_LISTEN"] = listen
    return subprocess.run(
        [sys.executable, "-m", "cuzk_supervisor", *command[1:]],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_healthcheck_command_passes_on_200_and_fails_otherwise(final, health_server, host):
    _, command = healthcheck(final)
    port = health_server.server_address[1]
    _Health.status = 200
    assert run_healthcheck(command, f"{host}:{port}").returncode == 0
    assert _Health.paths == ["/healthz"]
    _Health.status = 503
    failed = run_healthcheck(command, f"{host}:{port}")
    assert failed.returncode == 1
    assert len(failed.stdout.splitlines()) == 1
    assert "Traceback" not in failed.stdout + failed.stderr


def test_healthcheck_command_fails_in_one_line_when_nothing_listens(final, health_server):
    _, command = healthcheck(final)
    port = health_server.server_address[1]
    health_server.shutdown()
    health_server.server_close()
    failed = run_healthcheck(command, f"127.0.0.1:{port}")
    assert failed.returncode == 1
    assert failed.stdout.splitlines() == [
        f"unhealthy: GET http://127.0.0.1:{port}/healthz: Connection refused"
    ]
    assert failed.stderr == ""


# --- .dockerignore ---------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's (moby patternmatcher) syntax: ** any folders, * and ? within one name."""
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                out += "(?:.*/)?"
                i += 1
            else:
                out += ".*"
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            end = pattern.index("]", i)
            out += pattern[i : end + 1]
            i = end
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out + "$")


def ignore_rules(text: str) -> list[tuple[bool, re.Pattern[str], str]]:
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((negate, _pattern_regex(pattern), pattern))
    return rules


def ignored(rules: list[tuple[bool, re.Pattern[str], str]], path: str) -> bool:
    """Last matching rule wins; a rule matches the path or any folder above it."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for negate, regex, _ in rules:
        if any(regex.match(c) for c in candidates):
            result = not negate
    return result


def build_context(root: Path) -> list[str]:
    rules = ignore_rules(DOCKERIGNORE.read_text())
    kept = [p for negate, _, p in rules if negate]  # literal prefixes that can bring a path back
    files = []
    for folder, dirs, names in os.walk(root):
        rel_folder = os.path.relpath(folder, root)
        for d in list(dirs):
            rel = os.path.normpath(os.path.join(rel_folder, d))
            if ignored(rules, rel) and not any(k.startswith(rel + "/") for k in kept):
                dirs.remove(d)  # nothing inside can come back: do not walk .venv, .git
        for name in names:
            rel = os.path.normpath(os.path.join(rel_folder, name))
            if not ignored(rules, rel):
                files.append(rel)
    return sorted(files)


def test_dockerignore_matcher_follows_docker_rules():
    rules = ignore_rules(DOCKERIGNORE.read_text())
    assert not ignored(rules, "pyproject.toml")
    assert not ignored(rules, "cuzk_supervisor/cli/commands/run.py")
    for path in (
        ".git/HEAD",
        ".venv/bin/python",
        "run/sim/c1.json",
        "tests/test_deploy.py",
        "supervisor/__pycache__/cli.cpython-311.pyc",
        "cuzk_supervisor/sim/__pycache__/x.pyc",
        "cuzk_supervisor.egg-info/PKG-INFO",
        "Dockerfile",
        ".env",
    ):
        assert ignored(rules, path), path


def test_build_context_is_what_the_dockerfile_copies(docker):
    context = build_context(ROOT)
    tops = {path.split("/")[0] for path in context}
    assert tops == {"pyproject.toml", "README.md", "constraints.txt", "cuzk_supervisor", "deploy"}
    assert [p for p in context if p.startswith("deploy/")] == ["deploy/onstart.sh"]
    assert not [p for p in context if "__pycache__" in p or p.endswith(".pyc")]
    for name, args in docker:
        if name == "COPY" and "--from=" not in args:
            *sources, _ = args.split()
            for source in sources:
                path = source.rstrip("/")
                assert path in tops or path in context, f"COPY {source}: not in the build context"


@pytest.mark.slow
def test_wheel_builds_from_the_docker_context_alone(tmp_path):
    """What the builder stage does (offline here: the venv's setuptools, no dependencies)."""
    context = tmp_path / "context"
    for rel in build_context(ROOT):
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, context / rel)
    out = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--quiet", "--wheel-dir", str(out), str(context)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = out.glob("cuzk_supervisor-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(zf.read(n) for n in names if n.endswith("entry_points.txt")).decode()
    assert "cuzk_supervisor/cli/main.py" in names
    assert "cuzk_supervisor/proto/proving_pb2.py" in names
    assert "cuzk_supervisor/sim/daemon/main.py" in names
    assert not [n for n in names if n.startswith("tests/")]
    # One import package, and not supervisord's: `pip install supervisor cuzk-supervisor` in one
    # venv must not have one overwrite the other (issue 16.1).
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"cuzk_supervisor"}, tops
    assert "cuzk-supervisor = cuzk_supervisor.cli.main:entry" in entry_points


# --- on-start hook ---------------------------------------------------------------------------

FAKE_SUPERVISOR = """#!/usr/bin/env bash
# Stands in for cuzk-supervisor: records its arguments and environment, then waits.
{
    printf 'args=%s\\n' "$*"
    for v in CUZK_SUPERVISOR_MANAGER_URL CUZK_SUPERVISOR_LABEL VAST_CONTAINERLABEL MIN_RATE \\
             CUZK_SUPERVISOR_STATE_DIR CUZK_SUPERVISOR_LOG_DIR OTHER_FROM_PID1 PAVAIL \\
             PAVAIL_SERVER; do
        printf '%s=%s\\n' "$v" "${!v-<unset>}"
    done
} > "$FAKE_RECORD.tmp.$$"
mv "$FAKE_RECORD.tmp.$$" "$FAKE_RECORD.$$.txt"
echo "fake supervisor output"
for ((i = 0; i < ${FAKE_LINES:-0}; i++)); do
    echo "fake line $i: $(printf 'x%.0s' {1..60})"
done
if [[ -n "${FAKE_LINES:-}" ]]; then echo "fake lines done"; fi
if [[ -n "${FAKE_EXIT:-}" ]]; then exit "$FAKE_EXIT"; fi
sleep 60 &
wait
"""


@pytest.fixture
def hook(tmp_path):
    fake = tmp_path / "bin" / "cuzk-supervisor"
    fake.parent.mkdir()
    fake.write_text(FAKE_SUPERVISOR)
    fake.chmod(0o755)
    started: list[int] = []

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        base = {
            "PATH": os.environ["PATH"],
            "CUZK_ONSTART_BIN": str(fake),
            "CUZK_ONSTART_LOG": str(tmp_path / "log" / "cuzk-supervisor.log"),
            "CUZK_ONSTART_PIDFILE": str(tmp_path / "run" / "onstart.pid"),
            "CUZK_ONSTART_PID1_ENVIRON": str(tmp_path / "no-such-environ"),
            "CUZK_SUPERVISOR_IMAGE_SETTINGS_FILE": str(tmp_path / "no-image-settings.toml"),
            "FAKE_RECORD": str(tmp_path / "record"),
        }
        proc = subprocess.run(
            ["bash", str(ONSTART), *args], env=base | env, capture_output=True, text=True,
            timeout=30, check=False,
        )  # fmt: skip
        started.extend(int(pid) for pid in re.findall(r"\(pid (\d+)\)", proc.stderr))
        return proc

    run.tmp = tmp_path  # type: ignore[attr-defined]
    try:
        yield run
    finally:
        for pid in set(started):  # only the pids the hook said it started
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)  # the hook's setsid made it a group leader
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)


def records(tmp_path: Path, count: int = 1) -> list[dict[str, str]]:
    deadline = time.monotonic() + patient(10)
    while time.monotonic() < deadline:
        found = sorted(tmp_path.glob("record.*.txt"))  # written whole (renamed into place)
        if len(found) >= count:
            break
        time.sleep(0.05)
    return [dict(line.split("=", 1) for line in f.read_text().splitlines()) for f in found]


def test_hook_starts_the_supervisor_in_the_background_with_its_environment(hook):
    proc = hook(
        "--bench-count", "3",
        CUZK_SUPERVISOR_MANAGER_URL="http://manager:8080", VAST_CONTAINERLABEL="C.42",
        MIN_RATE="31",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # The hook returned while the supervisor it started runs on (the fake one runs a minute).
    (pid,) = {int(p) for p in re.findall(r"\(pid (\d+)\)", proc.stderr)}
    assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE, "the hook waited for it"
    (rec,) = records(hook.tmp)
    assert rec["args"] == "run --bench-count 3"
    assert rec["CUZK_SUPERVISOR_MANAGER_URL"] == "http://manager:8080"
    assert rec["VAST_CONTAINERLABEL"] == "C.42"
    assert rec["MIN_RATE"] == "31"
    assert rec["CUZK_SUPERVISOR_STATE_DIR"] == "/data/supervisor/state"
    pid = int((hook.tmp / "run" / "onstart.pid").read_text())
    assert f"pid {pid}" in proc.stderr
    log = hook.tmp / "log" / "cuzk-supervisor.log"
    # A rotation renames the log before the next line makes it again: a missing file is "not yet".
    poll_until(lambda: "fake supervisor output" in log.read_text(), 30, what="the output logged")
    # Its own session: not killed with the hook's process group.
    assert os.getsid(pid) == pid

    again = hook(CUZK_SUPERVISOR_MANAGER_URL="http://manager:8080", VAST_CONTAINERLABEL="C.42")
    assert again.returncode == 0
    assert "already running" in again.stderr
    # A second supervisor would have replaced the pidfile before the hook returned.
    assert int((hook.tmp / "run" / "onstart.pid").read_text()) == pid
    assert len(records(hook.tmp)) == 1, "a second hook run must not start a second supervisor"


def test_hook_ignores_a_stale_pidfile_of_another_process(hook):
    pidfile = hook.tmp / "run" / "onstart.pid"
    pidfile.parent.mkdir()
    pidfile.write_text(f"{os.getpid()}\n")  # alive, but not a supervisor
    proc = hook(CUZK_SUPERVISOR_MANAGER_URL="http://m:1", VAST_CONTAINERLABEL="C.1")
    assert proc.returncode == 0, proc.stderr
    assert len(records(hook.tmp)) == 1
    assert int(pidfile.read_text()) != os.getpid()


def test_hook_refuses_to_start_without_a_manager_url(hook):
    proc = hook(VAST_CONTAINERLABEL="C.42")
    assert proc.returncode == 2
    assert "CUZK_SUPERVISOR_MANAGER_URL" in proc.stderr
    assert not list(hook.tmp.glob("record.*.txt"))


def test_hook_starts_with_the_manager_url_baked_into_the_image(hook):
    baked = hook.tmp / "image-settings.toml"
    baked.write_text('# baked\nmanager_url = "http://baked:8080"\n')
    proc = hook(VAST_CONTAINERLABEL="C.42", CUZK_SUPERVISOR_IMAGE_SETTINGS_FILE=str(baked))
    assert proc.returncode == 0, proc.stderr
    (rec,) = records(hook.tmp)
    # The supervisor reads the file itself (settings.load); the hook only checks it is there.
    assert rec["CUZK_SUPERVISOR_MANAGER_URL"] == "<unset>"


def test_hook_refuses_an_image_file_without_a_manager_url(hook):
    baked = hook.tmp / "image-settings.toml"
    baked.write_text('bench_budget_s = 100\n[daemon]\nmanager_url = "nested"\n')
    proc = hook(VAST_CONTAINERLABEL="C.42", CUZK_SUPERVISOR_IMAGE_SETTINGS_FILE=str(baked))
    assert proc.returncode == 2
    assert "no manager_url" in proc.stderr
    assert not list(hook.tmp.glob("record.*.txt"))


def test_hook_takes_missing_variables_from_pid1(hook):
    environ = hook.tmp / "environ"
    environ.write_bytes(
        b"VAST_CONTAINERLABEL=C.7\0MIN_RATE=44\0CUZK_SUPERVISOR_MANAGER_URL=http://m:1\0"
        b"OTHER_FROM_PID1=x\0CUZK_SUPERVISOR_LABEL=\0PAVAIL=pv-secret\0PAVAIL_SERVER=h:7\0"
    )
    proc = hook(CUZK_ONSTART_PID1_ENVIRON=str(environ), MIN_RATE="50")
    assert proc.returncode == 0, proc.stderr
    (rec,) = records(hook.tmp)
    assert rec["PAVAIL"] == "pv-secret", "the platform's PAVAIL reaches the supervisor unchanged"
    assert rec["PAVAIL_SERVER"] == "h:7"
    assert rec["VAST_CONTAINERLABEL"] == "C.7"
    assert rec["MIN_RATE"] == "50", "the hook's own value wins over PID 1's"
    assert rec["CUZK_SUPERVISOR_MANAGER_URL"] == "http://m:1"
    assert rec["OTHER_FROM_PID1"] == "<unset>", "only the supervisor's variables are taken"


def test_hook_foreground_becomes_the_supervisor(hook):
    proc = hook(
        "--foreground", "--exit-after-run",
        CUZK_SUPERVISOR_MANAGER_URL="http://m:1", VAST_CONTAINERLABEL="C.3", FAKE_EXIT="7",
    )  # fmt: skip
    assert proc.returncode == 7, "exec: the supervisor's exit code is the hook's"
    assert "fake supervisor output" in proc.stdout
    (rec,) = records(hook.tmp)
    assert rec["args"] == "run --exit-after-run"
    assert not (hook.tmp / "run" / "onstart.pid").exists()


@pytest.mark.parametrize(
    ("args", "env", "warns"),
    [
        ((), {}, True),
        (("--label", "C.9"), {}, False),
        (("--label=C.9",), {}, False),
        (("--bench-count", "3"), {"CUZK_SUPERVISOR_LABEL": "C.9"}, False),
        ((), {"VAST_CONTAINERLABEL": "C.9"}, False),
    ],
)
def test_hook_warns_about_a_missing_label_only_when_there_is_none(hook, args, env, warns):
    proc = hook("--foreground", *args, CUZK_SUPERVISOR_MANAGER_URL="http://m:1", FAKE_EXIT="0",
                **env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert ("no instance label" in proc.stderr) is warns, proc.stderr


def test_hook_warns_not_when_the_config_file_sets_the_label(hook):
    config = hook.tmp / "supervisor.toml"
    config.write_text('label = "C.9"\n')
    proc = hook("--foreground", "--config-file", str(config),
                CUZK_SUPERVISOR_MANAGER_URL="http://m:1", FAKE_EXIT="0")  # fmt: skip
    assert "no instance label" not in proc.stderr, proc.stderr


def test_concurrent_hook_runs_start_one_supervisor(hook):
    env = {"CUZK_SUPERVISOR_MANAGER_URL": "http://m:1", "VAST_CONTAINERLABEL": "C.5"}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda _: hook(**env), range(4)))
    assert [r.returncode for r in runs] == [0] * 4, [r.stderr for r in runs]
    started = [r for r in runs if "started " in r.stderr]
    assert len(started) == 1, [r.stderr for r in runs]
    assert sum("already running" in r.stderr for r in runs) == 3
    assert len(records(hook.tmp)) == 1
    # Give the others time to have started a second one, if they had: the record count is
    # polled for a second supervisor's record, which must never appear.
    with pytest.raises(AssertionError):
        poll_until(lambda: len(list(hook.tmp.glob("record.*.txt"))) > 1, 2.0)


# A mawk whose version text comes in two writes, as on a loaded machine: a reader that stops at
# the first line (`grep -q`) leaves the second write to SIGPIPE. It records how it was run.
SLOW_VERSION_AWK = """#!/usr/bin/env bash
if [[ "${1-}" == -W && "${2-}" == version ]]; then
    echo "mawk 1.3.4 20200120"
    sleep 0.5
    echo "Copyright 2008-2019,2020, Thomas E. Dickey"
    exit 0
fi
printf '%s\\n' "$*" > "$AWK_ARGS_RECORD"
exec REAL_AWK "$@"
"""


def test_hook_finds_mawk_whose_version_text_comes_in_two_writes(hook):
    real = shutil.which("mawk")
    assert real, "the hook's rotator is tested with Debian's awk (mawk)"
    wrapper = hook.tmp / "awkbin" / "awk"
    wrapper.parent.mkdir()
    wrapper.write_text(SLOW_VERSION_AWK.replace("REAL_AWK", real))
    wrapper.chmod(0o755)
    args_record = hook.tmp / "awk-args.txt"
    proc = hook(
        CUZK_SUPERVISOR_MANAGER_URL="http://m:1", VAST_CONTAINERLABEL="C.7",
        PATH=f"{wrapper.parent}:{os.environ['PATH']}", AWK_ARGS_RECORD=str(args_record),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    poll_until(args_record.exists, 10, what="the rotator started")
    assert args_record.read_text().startswith("-W interactive "), "mawk left reading in blocks"
    # Line by line: the first line is in the log while the supervisor still runs (in blocks,
    # it would wait in awk's buffer for 4 KiB more).
    log = hook.tmp / "log" / "cuzk-supervisor.log"
    poll_until(lambda: "fake supervisor output" in log.read_text(), 30, what="the output logged")


def test_hook_log_is_rotated_and_bounded(hook):
    log = hook.tmp / "log" / "cuzk-supervisor.log"
    proc = hook(
        CUZK_SUPERVISOR_MANAGER_URL="http://m:1", VAST_CONTAINERLABEL="C.6", FAKE_LINES="2000",
        CUZK_ONSTART_LOG_MAX_BYTES="20000", CUZK_ONSTART_LOG_BACKUPS="2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    poll_until(lambda: "fake lines done" in log.read_text(), 20, what="the last line logged")
    files = sorted(log.parent.iterdir())
    assert [f.name for f in files] == [
        "cuzk-supervisor.log", "cuzk-supervisor.log.1", "cuzk-supervisor.log.2",
    ]  # fmt: skip
    for f in files:
        assert f.stat().st_size <= 20000, f
        # Whole lines only: every file ends with a newline, none starts inside a line.
        text = f.read_text()
        assert text.endswith("\n")
        assert all(line.startswith(("fake", "nohup")) for line in text.splitlines()), f
    # The newest lines are kept; the oldest are gone (2000 lines are ~160 KB).
    assert "fake line 1999:" in log.read_text()
    assert "fake line 0:" not in "".join(f.read_text() for f in files)


def test_hook_refuses_a_log_bound_too_small(hook):
    proc = hook(CUZK_SUPERVISOR_MANAGER_URL="http://m:1", VAST_CONTAINERLABEL="C.6",
                CUZK_ONSTART_LOG_MAX_BYTES="10")  # fmt: skip
    assert proc.returncode == 2
    assert "CUZK_ONSTART_LOG_MAX_BYTES" in proc.stderr
    assert not list(hook.tmp.glob("record.*.txt"))


# --- Kubernetes ------------------------------------------------------------------------------

_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6,
          "G": 10**9, "T": 10**12, "": 1}  # fmt: skip


def quantity_bytes(value: str | int) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|K|M|G|T|)", str(value))
    assert match, f"not a memory quantity: {value!r}"
    return float(match[1]) * _UNITS[match[2]]


@pytest.fixture(scope="module")
def manifest() -> dict[str, dict]:
    yaml = pytest.importorskip("yaml", reason="PyYAML (dev extra) reads the manifest")
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    return {d["kind"]: d for d in docs}


@pytest.fixture(scope="module")
def pod(manifest) -> dict:
    return manifest["StatefulSet"]["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def container(pod) -> dict:
    (c,) = pod["containers"]
    return c


def pod_env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container["env"]}


def test_one_replica_with_a_persistent_data_volume(manifest, container):
    sts = manifest["StatefulSet"]["spec"]
    assert sts["replicas"] == 1
    (claim,) = sts["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/data"] == claim["metadata"]["name"]
    env = pod_env(container)
    state_dir = Path(env["CUZK_SUPERVISOR_STATE_DIR"]["value"])
    assert state_dir.is_relative_to("/data")


def test_gpu_and_a_memory_limit_the_plan_can_use(container):
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    assert int(limits["nvidia.com/gpu"]) >= 1
    memory = quantity_bytes(limits["memory"])
    assert quantity_bytes(requests["memory"]) == memory, "Guaranteed QoS: request = limit"
    usable_gib = memory / 2**30 * (1 - DEFAULTS.memory_margin_fraction)
    assert usable_gib >= DEFAULTS.memory_base_gib + DEFAULTS.memory_per_worker_gib, (
        "the limit must leave room for at least one partition worker"
    )


def pod_settings(container: dict) -> settings.Settings:
    """The settings the pod's literal env values give (the image's defaults for the rest)."""
    raw = {
        e["name"]: e["value"]
        for e in container["env"]
        if "value" in e and e["name"] in DECLARED_ENV and "$(" not in e["value"]
    }
    return settings.load({}, environ=raw).settings


PROBE_PATHS = {
    "startupProbe": "/startupz",
    "livenessProbe": "/healthz",
    "readinessProbe": "/readyz",
}


def test_probes_ask_the_health_server_what_they_mean(container):
    port = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = pod_env(container)
    listen = env["CUZK_SUPERVISOR_HEALTH_LISTEN"]["value"]
    assert listen == f"0.0.0.0:{DEFAULTS.health_listen.rpartition(':')[2]}"
    for probe, path in PROBE_PATHS.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert port.get(get["port"], get["port"]) == int(listen.rpartition(":")[2]), probe


async def test_probe_paths_exist_on_the_real_health_server(container):
    from cuzk_supervisor.serve.health import HealthServer
    from cuzk_supervisor.serve.metrics import SupervisorMetrics
    from cuzk_supervisor.serve.probes import StartupLatch

    source = SimpleNamespace(phase="warmup", daemon_ready=False, last_failure="")
    latch = StartupLatch()
    async with HealthServer("127.0.0.1:0", source, SupervisorMetrics(), startup=latch) as server:

        def status(path: str) -> int:
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            try:
                with opener.open(f"{server.url}{path}", timeout=5) as answer:
                    return int(answer.status)
            except urllib.error.HTTPError as exc:
                return exc.code

        seen = {
            probe: await asyncio.to_thread(status, container[probe]["httpGet"]["path"])
            for probe in PROBE_PATHS
        }
        # During warmup: alive, not started, not ready; none of them is a 404.
        assert seen == {"startupProbe": 503, "livenessProbe": 200, "readinessProbe": 503}
        latch.on_phase("settle")
        path = container["startupProbe"]["httpGet"]["path"]
        assert await asyncio.to_thread(status, path) == 200


def test_startup_budget_is_params_plus_daemon_start_plus_warmup(container):
    s = pod_settings(container)
    startup = container["startupProbe"]
    budget = startup["failureThreshold"] * startup["periodSeconds"]
    needed = s.params_timeout_s + s.daemon_startup_deadline_s + s.warmup_budget_s
    # Enough for the slowest start the supervisor itself allows, and not much more (register
    # and plan take minutes): beyond that the kubelet would wait on a start already given up.
    assert needed <= budget <= needed + 30 * 60, f"startup budget {budget}s for {needed}s"
    assert startup["timeoutSeconds"] >= 1
    live = container["livenessProbe"]
    live_budget = live["failureThreshold"] * live["periodSeconds"]
    # Liveness is the loop's heartbeat: minutes, not the length of a phase; and longer than
    # the health server's staleness threshold and one request deadline.
    assert 60 <= live_budget < budget
    assert live["timeoutSeconds"] >= 5
    ready = container["readinessProbe"]
    assert ready["periodSeconds"] * ready["failureThreshold"] <= 60, "unready soon after a crash"


def test_the_instance_label_is_unique_to_the_pod(container):
    env = pod_env(container)
    fields = {
        name: entry["valueFrom"]["fieldRef"]["fieldPath"]
        for name, entry in env.items()
        if "fieldRef" in entry.get("valueFrom", {})
    }
    assert fields["POD_NAMESPACE"] == "metadata.namespace"
    assert fields["POD_NAME"] == "metadata.name"
    assert fields["POD_UID"] == "metadata.uid"
    label = env["CUZK_SUPERVISOR_LABEL"]["value"]
    assert label == "k8s.$(POD_NAMESPACE).$(POD_NAME).$(POD_UID)"
    # As the kubelet expands it, the label passes the label setting's rule.
    settings.load({}, environ={"CUZK_SUPERVISOR_LABEL": kubelet_expanded(label)})
    # $(VAR) expands only variables defined earlier in the list.
    names = [e["name"] for e in container["env"]]
    for var in ("POD_NAMESPACE", "POD_NAME", "POD_UID"):
        assert names.index(var) < names.index("CUZK_SUPERVISOR_LABEL"), var


def test_service_name_names_a_headless_service_for_the_pods(manifest):
    sts = manifest["StatefulSet"]
    service = manifest["Service"]
    assert service["metadata"]["name"] == sts["spec"]["serviceName"]
    assert service["spec"]["clusterIP"] == "None"
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


# What the kubelet puts for $(VAR) from the downward API, for a typical pod.
POD_FIELDS = {
    "POD_NAMESPACE": "proving",
    "POD_NAME": "cuzk-supervisor-0",
    "POD_UID": "5f1c1e3a-9b2d-4c7e-8a61-0d2f4b6c8e90",
}


def kubelet_expanded(value: str) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: POD_FIELDS.get(m.group(1), m.group(0)), value)


def test_grace_period_covers_the_daemons_stop_and_ours(pod, container):
    env = pod_env(container)
    raw = {
        k: kubelet_expanded(e["value"])
        for k, e in env.items()
        if "value" in e and k in DECLARED_ENV
    }
    daemon_grace = settings.load({}, environ=raw).settings.daemon_stop_grace_s
    assert pod["terminationGracePeriodSeconds"] > daemon_grace + 10


def test_manager_settings_come_from_a_configmap_and_the_token_from_a_secret(manifest, container):
    env = pod_env(container)
    url = env["CUZK_SUPERVISOR_MANAGER_URL"]["valueFrom"]["configMapKeyRef"]
    configmap = manifest["ConfigMap"]
    assert configmap["metadata"]["name"] == url["name"]
    assert settings.load({}, environ={"CUZK_SUPERVISOR_MANAGER_URL": configmap["data"][url["key"]]})
    token = env["CUZK_SUPERVISOR_MANAGER_TOKEN"]
    assert "value" not in token
    assert token["valueFrom"]["secretKeyRef"]["name"]
    for name, entry in env.items():
        if SECRET_NAME.search(name):
            assert "secretKeyRef" in entry.get("valueFrom", {}), f"{name} must come from a Secret"
    assert "Secret" not in manifest, "no Secret with its data in the repository"


def test_literal_settings_in_the_pod_are_declared_and_valid(container):
    raw = {
        e["name"]: kubelet_expanded(e["value"])
        for e in container["env"]
        if e["name"].startswith(settings.ENV_PREFIX) and "value" in e
    }
    assert set(raw) <= DECLARED_ENV, f"unknown settings: {set(raw) - DECLARED_ENV}"
    settings.load({}, environ=raw)


# --- the linters -----------------------------------------------------------------------------


def test_lint_deploy_passes():
    bin_dir = Path(sys.executable).parent
    missing = [
        t for t in ("hadolint", "kubernetes-validate", "shellcheck")
        if not (bin_dir / t).exists() and not shutil.which(t)
    ]  # fmt: skip
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (dev extra); CI runs .ci/lint-deploy")
    proc = subprocess.run(
        ["bash", str(LINT)], capture_output=True, text=True, timeout=120, check=False,
        env=os.environ | {"VENV": str(bin_dir.parent)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the platform's vastai CLI, stood in for the image test's deploy path --------------------

STANDIN = ROOT / "deploy" / "vastai-standin.py"
IMAGE_TEST = ROOT / "deploy" / "image-test.sh"
FAKE_DOCKER = """#!{python}
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "calls.jsonl"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
names = os.path.join(here, "names")
if sys.argv[1:3] == ["ps", "-a"] and os.path.exists(names):
    print(open(names).read())
"""


@pytest.fixture
def standin(tmp_path):
    """Runs deploy/vastai-standin.py against a fake docker that records its argv."""
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER.format(python=sys.executable))
    docker.chmod(0o755)
    env = os.environ | {
        "DOCKER": str(docker),
        "VASTAI_STANDIN_STATE": str(tmp_path / "state"),
        "VASTAI_STANDIN_EXTRA_ENV": "CUZK_SUPERVISOR_MANAGER_TOKEN=t0k\n",
    }

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(STANDIN), *args], capture_output=True, text=True, env=env,
            timeout=30, check=False,
        )  # fmt: skip

    def calls() -> list[list[str]]:
        path = tmp_path / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    return SimpleNamespace(run=run, calls=calls, names=tmp_path / "names")


def test_standin_creates_as_the_platform_does_from_the_managers_own_argv(standin):
    from cuzk_supervisor.sim.manager.vast import ONSTART_CMD, VastCLI, new_contract

    argv = VastCLI(str(STANDIN), "img:test").create_argv(7, 30.0, "p4ss", "host:1")
    done = standin.run(*argv[1:])
    assert done.returncode == 0, done.stderr
    assert new_contract(done.stdout) == 1000
    run, onstart = standin.calls()
    # Its own init instead of the image's entrypoint: the supervisor is not PID 1.
    assert run[:2] == ["run", "-d"]
    assert run[-4:] == ["--entrypoint", "sleep", "img:test", "infinity"]
    assert run[run.index("--network") + 1] == "host"
    assert run[run.index("--name") + 1] == "vast-1000"
    env = [run[i + 1] for i, word in enumerate(run) if word == "-e"]
    assert env == [
        "PAVAIL=p4ss", "PAVAIL_SERVER=host:1", "MIN_RATE=30.0",
        "CUZK_SUPERVISOR_MANAGER_TOKEN=t0k", "VAST_CONTAINERLABEL=C.1000",
    ]  # fmt: skip
    # Then the on-start command, inside the container, through a shell.
    assert onstart == ["exec", "-d", "vast-1000", "sh", "-c", ONSTART_CMD]
    # The next instance gets the next id.
    assert new_contract(standin.run(*argv[1:]).stdout) == 1001


def test_standin_reboots_with_the_onstart_command_again_destroys_and_lists(standin):
    from cuzk_supervisor.sim.manager.platform import parse_platform
    from cuzk_supervisor.sim.manager.vast import ONSTART_CMD, VastCLI

    argv = VastCLI(str(STANDIN), "img").create_argv(7, 30.0, "p", "s")
    assert standin.run(*argv[1:]).returncode == 0
    assert standin.run("reboot", "instance", "1000").returncode == 0
    assert standin.calls()[2:] == [
        ["restart", "-t", "1", "vast-1000"],
        ["exec", "-d", "vast-1000", "sh", "-c", ONSTART_CMD],
    ]
    assert standin.run("destroy", "instance", "1000").returncode == 0
    assert standin.calls()[-1] == ["rm", "-f", "vast-1000"]
    standin.names.write_text("vast-1002\nvast-1000\nsomething-else\n")
    shown = standin.run("show", "instances", "--raw")
    assert shown.returncode == 0, shown.stderr
    assert [e.id for e in parse_platform(shown.stdout).entries] == [1000, 1002]


@pytest.mark.parametrize(
    "args",
    [
        ["create", "instance", "7", "--image", "i", "--onstart-cmd", "x"],  # no --ssh --direct
        ["create", "instance", "7", "--image", "i", "--env", "PAVAIL=x", "--ssh", "--direct",
         "--onstart-cmd", "x"],  # not -e pairs
        ["start", "instance", "7"],
    ],
)  # fmt: skip
def test_standin_refuses_what_the_manager_never_sends(standin, args):
    done = standin.run(*args)
    assert done.returncode != 0
    assert "vastai-standin" in done.stderr
    assert not [c for c in standin.calls() if c[0] == "run"]


def test_image_test_bakes_settings_the_supervisor_accepts(tmp_path):
    """The deploy image's CUZK_SETTINGS in deploy/image-test.sh pass the bake's own check, so
    a bad edit fails here and not minutes into the image test."""
    from cuzk_supervisor.cli import bake

    text = IMAGE_TEST.read_text()
    found = re.search(r"^deploy_settings='([^']*)'$", text, re.MULTILINE)
    assert found, "deploy_settings='...' not found in deploy/image-test.sh"
    out = tmp_path / "settings.toml"
    s = bake.check(bake.render("http://127.0.0.1:1", found.group(1)), out)
    assert s.daemon_binary == "cuzk-sim-daemon"
    assert s.worker_commands, "the deploy test reads PAVAIL from the worker command's environment"
