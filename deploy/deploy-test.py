#!/usr/bin/env python3
"""The manager's Deploy button, end to end: the deploy part of ``make image-test``.

deploy/image-test.sh runs it (with the venv's Python) once it has built IMAGE, the image with the
manager's URL and the fleet's settings baked in (build arguments) and the simulated daemon where
cuzk stands. On the engine that test started (DOCKER, DOCKER_HOST), it:

  1. starts the simulated manager on LISTEN (the host's loopback) with ``--vastai
     deploy/vastai-standin.py --deploy-image IMAGE``, PAVAIL and PAVAIL_SERVER in its environment
     (the real manager passes its own on) and a manager token added by the platform stand-in's
     template (VASTAI_STANDIN_EXTRA_ENV);
  2. sends ``POST /api/deploy`` as the dashboard does; the stand-in runs the container with
     ``sleep infinity`` as its init and the deploy's environment, then the on-start command
     ``nohup /usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &`` in it; the instance
     must register with the baked URL and reach ``running`` with its rate and its logs in the
     dashboard's tabs, while ``curl -sf --max-time 3 http://localhost:9821/status``, polled in
     the container, answers in every phase from the warmup on;
  3. checks that PAVAIL reaches the worker command's environment and the token reaches no child;
  4. reboots the instance (container restart, on-start command again): the same instance
     resumes (same uuid, no new registration, no second bench) and is running again;
  5. kills it from the dashboard (``POST /api/kill`` with its vast id: the container goes);
  6. deploys with MIN_RATE above the machine's rate: the bench fails and the container is
     destroyed.

Deploys run one after another: the containers share the host's network (the manager is on its
loopback), so two at once would both want the daemon's status port 9821.

Prints ``image-test: ok: ...`` lines, writes the figures (one line) to --figures, and exits 1 with
a ``FAIL:`` line (the manager's log, the container's logs) when a check fails. Standard library
only, like the stand-in.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

PASS_MIN_RATE = 5.0  # the simulated machine proves far more than this an hour
FAIL_MIN_RATE = 50_000.0  # and far less than this (the setting allows up to 100000)
DEPLOY_DEADLINE_S = 150.0
LOG_TABS = ("setup", "benchdaemon", "benchout", "cuzk", "curio")
PANEL_PHASES = ("warmup", "restart", "settle", "bench", "report", "run")
PANEL_LOG = "/tmp/status-panel.log"
# Polled in the container, as the manager's status panel asks over SSH: the phase (the health
# server's /readyz) before and after each status request, so that a request is counted for a
# phase only when it began and ended in it.
PANEL_POLLER = r"""
phase() {
    curl -s --max-time 2 http://127.0.0.1:9822/readyz |
        sed -n 's/.*"phase": *"\([a-z_]*\)".*/\1/p'
}
while :; do
    before=$(phase)
    if curl -sf --max-time 3 -o /dev/null http://localhost:9821/status; then r=ok; else r=no; fi
    echo "$(date +%s.%N) ${before:--} $(phase | grep . || echo -) $r"
    sleep 0.2
done >> @LOG@
""".replace("@LOG@", PANEL_LOG)
SUPERVISOR_PIDFILE = "/run/cuzk-supervisor-onstart.pid"  # deploy/onstart.sh's default
WORKER_PIDFILE = "/data/supervisor/state/worker-curio.pid"  # the image's state_dir, worker 0


class Failed(Exception):
    pass


def say(text: str) -> None:
    print(f"image-test: {text}", flush=True)


def wait_for(
    what: str, check: Callable[[], T | None], deadline_s: float, every_s: float = 0.5
) -> T:
    deadline = time.monotonic() + deadline_s
    while True:
        value = check()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise Failed(f"{what}: not within {deadline_s:g} s")
        time.sleep(every_s)


class Docker:
    def __init__(self, cli: str) -> None:
        self.cli = shlex.split(cli)

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        done = subprocess.run(
            [*self.cli, *args], capture_output=True, text=True, errors="replace", timeout=timeout
        )
        if check and done.returncode != 0:
            raise Failed(f"docker {shlex.join(args)[:200]}: {done.stderr.strip()[-300:]}")
        return done.stdout

    def exists(self, name: str) -> bool:
        return bool(self.run("ps", "-aq", "--filter", f"name=^{name}$").strip())

    def sh(self, name: str, script: str, check: bool = True) -> str:
        return self.run("exec", name, "sh", "-c", script, check=check)

    def environ(self, name: str, pid: int) -> dict[str, str]:
        raw = self.sh(name, f"tr '\\0' '\\n' < /proc/{pid}/environ")
        return dict(line.split("=", 1) for line in raw.splitlines() if "=" in line)

    def pids(self, name: str, needle: str) -> list[int]:
        """The container's processes whose command line holds ``needle``."""
        script = (
            'for p in /proc/[0-9]*; do [ "${p#/proc/}" = $$ ] && continue; '
            "c=$(tr '\\0' ' ' < $p/cmdline 2> /dev/null) || continue; "
            f'case "$c" in *{shlex.quote(needle)}*) echo ${{p#/proc/}} ;; esac; done'
        )
        return sorted(int(pid) for pid in self.sh(name, script).split() if pid != "self")


class Manager:
    def __init__(self, url: str) -> None:
        self.url = url

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        with urllib.request.urlopen(request, timeout=30) as answer:
            raw = answer.read()
        return json.loads(raw) if raw.strip() else None

    def records(self, label: str) -> list[dict[str, Any]]:
        return [r for r in self.call("GET", "/status") if r["label"] == label]

    def record(self, label: str) -> dict[str, Any] | None:
        found = self.records(label)
        return found[0] if found else None

    def requests(self, path: str, since: int = 0) -> list[dict[str, Any]]:
        return list(self.call("GET", f"/sim/requests?since={since}&path={path}"))

    def last_seq(self) -> int:
        entries = self.call("GET", "/sim/requests?sim=1")
        return max((int(e["seq"]) for e in entries), default=0)

    def log_lines(self, needle: str) -> list[str]:
        return [e["text"] for e in self.call("GET", "/sim/manager-log") if needle in e["text"]]

    def tab(self, uuid: str, source: str) -> list[str]:
        return [e["text"] for e in self.call("GET", f"/api/instance-logs/{uuid}?source={source}")]


class DeployTest:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.docker = Docker(os.environ.get("DOCKER", "docker"))
        self.manager = Manager(f"http://{args.listen}")
        self.pavail = "pavail-" + secrets.token_hex(8)
        self.pavail_server = "pavail.example:4443"
        self.token = os.environ.get("CUZK_DEPLOY_TEST_TOKEN") or "tok-" + secrets.token_hex(12)
        self.proc: subprocess.Popen[bytes] | None = None
        self.figures: dict[str, str] = {}

    # --- the manager ---------------------------------------------------------------------
    def start_manager(self) -> None:
        work = Path(self.args.work)
        env = {
            **os.environ,
            "PAVAIL": self.pavail,
            "PAVAIL_SERVER": self.pavail_server,
            "VASTAI_STANDIN_STATE": str(work / "vastai"),
            "VASTAI_STANDIN_EXTRA_ENV": f"CUZK_SUPERVISOR_MANAGER_TOKEN={self.token}",
        }
        argv = [
            sys.executable, "-m", "cuzk_supervisor.sim.manager",
            "--db", str(work / "manager.db"), "--listen", self.args.listen,
            "--vastai", self.args.standin, "--deploy-image", self.args.image,
        ]  # fmt: skip
        with open(work / "manager.log", "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)

        def up() -> bool | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise Failed(f"the simulated manager exited {self.proc.returncode}")
            try:
                self.manager.call("GET", "/status")
            except OSError:
                return None
            return True

        wait_for("the simulated manager answering", up, 20, 0.1)

    def stop_manager(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def deploy(self, offer_id: int, min_rate: float) -> tuple[int, float]:
        started = time.monotonic()
        answer = self.manager.call(
            "POST", "/api/deploy", {"offer_id": offer_id, "min_rate": min_rate}
        )
        if not (isinstance(answer, dict) and answer.get("ok") and answer.get("instance_id")):
            raise Failed(f"POST /api/deploy answered {answer}")
        return int(answer["instance_id"]), started

    def standin(self, *args: str) -> None:
        env = {
            **os.environ,
            "VASTAI_STANDIN_STATE": str(Path(self.args.work) / "vastai"),
        }
        done = subprocess.run(
            [self.args.standin, *args], capture_output=True, text=True, env=env, timeout=120
        )
        if done.returncode != 0:
            raise Failed(f"vastai-standin {' '.join(args)}: {done.stderr.strip()[-300:]}")

    # --- the checks ----------------------------------------------------------------------
    def reach_running(self, ident: int, started: float, since: int = 0) -> tuple[dict, float]:
        name, label = f"vast-{ident}", f"C.{ident}"

        def running() -> dict[str, Any] | None:
            if not self.docker.exists(name):
                raise Failed(f"{name} is gone before running (manager: {self.record_text(label)})")
            record = self.manager.record(label)
            if record is None or record["state"] != "running":
                return None
            return record if self.manager.requests("/running", since) else None

        record = wait_for(f"{label} running", running, DEPLOY_DEADLINE_S)
        return record, time.monotonic() - started

    def record_text(self, label: str) -> str:
        record = self.manager.record(label)
        return "no record" if record is None else json.dumps(record)

    def check_container(self, ident: int, min_rate: float) -> None:
        """The container as the platform makes it: its init, the deploy's environment, the
        on-start command's output where the platform keeps it; no manager URL given (it is the
        image's)."""
        name = f"vast-{ident}"
        config = json.loads(self.docker.run("inspect", "-f", "{{json .Config}}", name))
        env = dict(item.split("=", 1) for item in config["Env"])
        expected = {
            "PAVAIL": self.pavail,
            "PAVAIL_SERVER": self.pavail_server,
            "MIN_RATE": f"{min_rate:.1f}",
            "VAST_CONTAINERLABEL": f"C.{ident}",
        }
        wrong = {k: env.get(k) for k, v in expected.items() if env.get(k) != v}
        if config["Entrypoint"] != ["sleep"] or config["Cmd"] != ["infinity"] or wrong:
            raise Failed(
                f"{name}: entrypoint {config['Entrypoint']} {config['Cmd']}, env off: {wrong}"
            )
        if "CUZK_SUPERVISOR_MANAGER_URL" in env:
            raise Failed(f"{name} was given a manager URL: the test must use the baked one")

    def check_hook_log(self, name: str) -> None:
        """The on-start hook's own lines where the platform's on-start command puts them."""
        hook = self.docker.sh(name, "cat /var/log/entrypoint.log")
        if "started cuzk-supervisor run" not in hook:
            raise Failed(f"/var/log/entrypoint.log: {hook!r}")

    def check_logs(self, uuid: str) -> str:
        def all_tabs() -> dict[str, int] | None:
            counts = {tab: len(self.manager.tab(uuid, tab)) for tab in LOG_TABS}
            return counts if all(counts.values()) else None

        try:
            counts = wait_for("log lines in every tab", all_tabs, 15)
        except Failed:
            counts = {tab: len(self.manager.tab(uuid, tab)) for tab in LOG_TABS}
            raise Failed(f"a dashboard tab stayed empty: {counts}") from None
        bench = self.manager.tab(uuid, "benchout")
        if not any("proofs/hour" in line or "rate" in line for line in bench):
            raise Failed(f"benchout has no rate line: {bench[-3:]}")
        return ", ".join(f"{tab} {n}" for tab, n in counts.items())

    def panel(self, name: str) -> str:
        """The status panel's answers per phase, from the poller's log. In every phase from the
        warmup on that the poller saw it answered, except in the restart, while the daemon is
        stopped and started again (it must answer again after it: same port); in the run phase
        every time. The warmup, the bench and the run must have been seen."""
        rows = [
            line.split()
            for line in self.docker.sh(name, f"cat {PANEL_LOG}").splitlines()
            if len(line.split()) == 4
        ]
        seen: dict[str, list[int]] = {}
        for _, before, after, result in rows:
            if before == after and before in PANEL_PHASES:
                counts = seen.setdefault(before, [0, 0])
                counts[0] += result == "ok"
                counts[1] += 1
        shown = ", ".join(f"{p} {seen[p][0]}/{seen[p][1]}" for p in PANEL_PHASES if p in seen)
        silent = [p for p, (ok, _) in seen.items() if ok == 0 and p != "restart"]
        unseen = [p for p in ("warmup", "bench", "run") if p not in seen]
        if silent or unseen:
            raise Failed(
                f"status panel answered/asked per phase: {shown}; never answered in {silent}, "
                f"phases not seen: {unseen}"
            )
        # In the run phase the daemon is up for good: every answer from its second poll on.
        run = [r for r in rows if r[1] == r[2] == "run"][1:]
        if any(r[3] != "ok" for r in run):
            raise Failed(f"the status panel failed in the run phase: {run}")
        return shown

    def check_environments(self, name: str) -> str:
        """PAVAIL and PAVAIL_SERVER reach the worker command unchanged; the token is in the
        supervisor's environment only, never in a child's."""
        supervisor = int(self.docker.sh(name, f"cat {SUPERVISOR_PIDFILE}").strip())
        if not self.environ_has_token(name, supervisor):
            raise Failed(
                "the supervisor was not given the token: the check below would prove nothing"
            )
        # The pidfile holds "PID START_TIME" (daemon/pidfile.py).
        pidfile = wait_for(
            "the worker command's pidfile",
            lambda: (
                self.docker.sh(name, f"cat {WORKER_PIDFILE} 2> /dev/null", check=False).split()
                or None
            ),
            10,
        )
        worker = int(pidfile[0])
        env = self.docker.environ(name, worker)
        if env.get("PAVAIL") != self.pavail or env.get("PAVAIL_SERVER") != self.pavail_server:
            raise Failed(
                f"the worker command (pid {worker}) has PAVAIL={env.get('PAVAIL')!r} "
                f"PAVAIL_SERVER={env.get('PAVAIL_SERVER')!r}"
            )
        children = [*self.docker.pids(name, "cuzk-sim-daemon"), worker]
        leaking = [pid for pid in children if self.environ_has_token(name, pid)]
        if leaking:
            raise Failed(f"the manager token is in the environment of pid(s) {leaking}")
        return f"worker pid {worker}, daemon pid(s) {children[:-1]}"

    def environ_has_token(self, name: str, pid: int) -> bool:
        raw = self.docker.sh(name, f"cat /proc/{pid}/environ")
        return self.token in raw

    def check_no_second_instance(self, label: str, uuid: str, since: int) -> None:
        records = self.manager.records(label)
        if [r["uuid"] for r in records] != [uuid]:
            raise Failed(f"after the reboot {label} has records {records}, not one with {uuid}")
        new = self.manager.log_lines(f"[register] new label={label}")
        if len(new) != 1:
            raise Failed(f"{label} registered as a new instance {len(new)} times: {new}")
        benches = self.manager.requests("/bench-done", since)
        if benches:
            raise Failed(f"a second bench after the reboot: {benches}")

    def container_gone(self, ident: int) -> bool | None:
        return True if not self.docker.exists(f"vast-{ident}") else None

    # --- the run ---------------------------------------------------------------------------
    def run(self) -> None:
        self.start_manager()
        say(f"deploy: simulated manager on http://{self.args.listen} --vastai {self.args.standin}")

        # A passing deploy.
        ident, started = self.deploy(101, PASS_MIN_RATE)
        name, label = f"vast-{ident}", f"C.{ident}"
        self.docker.run("exec", "-d", name, "sh", "-c", PANEL_POLLER)
        self.check_container(ident, PASS_MIN_RATE)
        record, to_running = self.reach_running(ident, started)
        self.check_hook_log(name)
        uuid, rate = record["uuid"], float(record.get("bench_rate") or 0)
        if not rate >= PASS_MIN_RATE:
            raise Failed(f"{label} running with rate {rate}: {record}")
        self.figures["deploy_to_running_s"] = f"{to_running:.1f}"
        say(
            f"ok: POST /api/deploy (MIN_RATE={PASS_MIN_RATE:.1f}) -> {name} (docker run "
            "--entrypoint sleep IMG infinity, then docker exec sh -c 'nohup "
            "/usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &') registered with the "
            f"baked manager URL and is running in {to_running:.1f} s, rate {rate:.1f} proofs/hour"
        )
        say(f"ok: dashboard tabs (lines): {self.check_logs(uuid)}")
        panel = self.panel(name)
        say(
            "ok: curl -sf --max-time 3 http://localhost:9821/status in the container, "
            f"answered/asked per phase: {panel}"
        )
        say(
            "ok: PAVAIL and PAVAIL_SERVER reach the worker command, the token no child "
            f"({self.check_environments(name)})"
        )

        # A second on-start run while it runs starts nothing.
        self.docker.sh(name, "/usr/local/bin/entrypoint.sh > /tmp/hook-again.log 2>&1")
        again = self.docker.sh(name, "cat /tmp/hook-again.log")
        supervisors = self.docker.pids(name, "cuzk-supervisor run")
        if "already running" not in again or len(supervisors) != 1:
            raise Failed(f"a second on-start run: {again!r}, supervisors {supervisors}")

        # The platform's reboot: processes gone, disk kept, the on-start command again.
        since = self.manager.last_seq()
        rebooted = time.monotonic()
        self.standin("reboot", "instance", str(ident))
        _, to_running = self.reach_running(ident, rebooted, since)
        self.check_no_second_instance(label, uuid, since)
        supervisors = self.docker.pids(name, "cuzk-supervisor run")
        if len(supervisors) != 1:
            raise Failed(f"after the reboot {len(supervisors)} supervisors run: {supervisors}")
        self.docker.sh(name, "curl -sf --max-time 3 -o /dev/null http://localhost:9821/status")
        self.figures["reboot_to_running_s"] = f"{to_running:.1f}"
        say(
            f"ok: reboot instance {ident} (container restart, on-start command again): the same "
            f"instance (uuid {uuid}) resumed, no new registration, no second bench, running "
            f"again in {to_running:.1f} s; a second hook run while it ran started nothing"
        )

        # The manager's sweep lists the platform's instances through `vastai show instances
        # --raw`: the running instance is on it and is left alone.
        swept = self.manager.call("POST", "/sim/sweep")
        listed = [e["id"] for e in self.manager.call("GET", "/sim/state")["platform"] or []]
        if swept["kills"] or swept["sweeps"].get("error") or ident not in listed:
            raise Failed(f"the sweep through show instances: {swept}, platform list {listed}")
        say(f"ok: the sweep (vastai show instances --raw) lists {listed} and kills nothing")

        # The dashboard's kill with the vast id destroys the container (and frees the host's
        # ports for the next deploy).
        self.manager.call("POST", "/api/kill", {"uuid": uuid, "vast_id": ident})
        wait_for(f"{name} destroyed after /api/kill", lambda: self.container_gone(ident), 60)
        say(f"ok: POST /api/kill with vast_id {ident}: container destroyed")

        # A deploy whose MIN_RATE the machine cannot reach.
        ident, started = self.deploy(102, FAIL_MIN_RATE)
        label = f"C.{ident}"
        wait_for(
            f"vast-{ident} destroyed after a failed bench",
            lambda: self.container_gone(ident),
            DEPLOY_DEADLINE_S,
        )
        destroyed = time.monotonic() - started
        record = self.manager.record(label) or {}
        reason = str(record.get("kill_reason"))
        if record.get("state") != "killed" or "below min_rate" not in reason:
            raise Failed(f"{label} after its failed bench: {record}")
        self.figures["failed_deploy_destroyed_s"] = f"{destroyed:.1f}"
        say(
            f"ok: POST /api/deploy (MIN_RATE={FAIL_MIN_RATE:.1f}) -> {label}: "
            f"{reason}; container destroyed {destroyed:.1f} s after the deploy"
        )

    def dump(self) -> None:
        """What a failure is read from."""
        log = Path(self.args.work) / "manager.log"
        if log.exists():
            sys.stderr.write("--- the simulated manager's output (tail):\n")
            sys.stderr.write("\n".join(log.read_text(errors="replace").splitlines()[-15:]) + "\n")
        try:
            names = self.docker.run("ps", "-a", "--format", "{{.Names}}", check=False).split()
            for name in (n for n in names if n.startswith("vast-")):
                out = self.docker.sh(
                    name, "tail -n 25 /var/log/entrypoint.log /var/log/cuzk-supervisor.log",
                    check=False,
                )  # fmt: skip
                sys.stderr.write(f"--- {name}:\n{out}\n")
        except (Failed, OSError, subprocess.SubprocessError) as exc:
            sys.stderr.write(f"(no container logs: {exc})\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--image", required=True, help="the image /api/deploy starts")
    p.add_argument("--listen", required=True, help="the simulated manager's HOST:PORT, baked in")
    p.add_argument("--work", required=True, help="a scratch folder")
    p.add_argument("--standin", default="deploy/vastai-standin.py")
    p.add_argument("--figures", help="file the figures are written to (one line)")
    args = p.parse_args()
    test = DeployTest(args)
    try:
        test.run()
    except Exception as exc:
        test.dump()
        detail = str(exc) if isinstance(exc, Failed) else f"{type(exc).__name__}: {exc}"
        say(f"FAIL: deploy path: {detail}")
        return 1
    finally:
        test.stop_manager()
    if args.figures:
        Path(args.figures).write_text(
            " ".join(f"{k}={v}" for k, v in test.figures.items()) + "\n", encoding="utf-8"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
