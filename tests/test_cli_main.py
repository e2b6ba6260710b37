"""The command line itself: help that fits each command, short errors, no abbreviations, and a
closed pipe that ends quietly."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cuzk_supervisor import exitcodes, settings
from cuzk_supervisor.cli import main as cli
from cuzk_supervisor.cli.main import build_parser

REPO = Path(__file__).resolve().parents[1]
ALL = {decl.flag for decl in settings.declarations()}


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def help_of(command: str, monkeypatch: pytest.MonkeyPatch, columns: int = 80) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    return subparsers()[command].format_help()


def listed_flags(text: str) -> set[str]:
    return set(re.findall(r"^  (--[a-z0-9-]+)", text, flags=re.MULTILINE))


def sections(text: str) -> dict[str, set[str]]:
    """Section title -> the flags listed under it."""
    out: dict[str, set[str]] = {}
    title = ""
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            title = line[:-1]
        elif (match := re.match(r"  (--[a-z0-9-]+)", line)) is not None:
            out.setdefault(title, set()).add(match.group(1))
    return out


@pytest.mark.parametrize("command", ["plan", "doctor"])
def test_plan_and_doctor_help_fit_a_screen(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    text = help_of(command, monkeypatch, columns=80)
    # Short beside run's (hundreds of lines), though every flag names its variable (issue 45).
    assert len(text.splitlines()) < 70, text


def test_each_command_lists_only_the_settings_it_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    setting_flags = {c: listed_flags(help_of(c, monkeypatch)) & ALL for c in subparsers()}
    assert setting_flags["run"] == ALL  # the lifecycle reads them all
    memory = {d.flag for d in settings.declarations() if d.group == "memory"}
    assert setting_flags["plan"] == memory
    assert setting_flags["config"] == set()  # it prints every value; flags are not its subject
    assert setting_flags["healthcheck"] == {"--health-listen", "--health-enabled"}
    assert "--state-dir" in setting_flags["doctor"]
    assert "--gpu-probe" in setting_flags["doctor"]
    for command in ("plan", "doctor", "daemon", "healthcheck"):
        assert "--bench-count" not in setting_flags[command], command
    daemon = setting_flags["daemon"]
    assert {"--workers", "--daemon-binary", "--run-dir", "--crash-loop-failures"} <= daemon
    assert not {"--manager-url", "--proactive-oom", "--gpu-probe", "--state-dir"} & daemon


def test_help_groups_match_what_the_settings_do(monkeypatch: pytest.MonkeyPatch) -> None:
    found = sections(help_of("run", monkeypatch))
    titled = {flag: title for title, flags in found.items() for flag in flags}
    assert titled["--log-level"].startswith("logging settings")  # was under "files settings"
    assert titled["--state-dir"].startswith("folders settings")
    assert titled["--params-timeout-s"].startswith("params settings")
    assert titled["--daemon-stop-grace-s"].startswith("supervision settings")


def test_help_shows_metavars_defaults_and_no_markup(monkeypatch: pytest.MonkeyPatch) -> None:
    for command in subparsers():
        text = help_of(command, monkeypatch, columns=200)
        assert "`" not in text, command
        assert not re.search(r"^  --[a-z0-9-]+ V ", text, flags=re.MULTILINE), command
    text = " ".join(help_of("run", monkeypatch, columns=200).split())
    env = "env: CUZK_SUPERVISOR_"
    assert re.search(
        rf"--max-workers N +most workers planned .*\(default: 12; {env}MAX_WORKERS\)", text
    )
    assert re.search(
        rf"--state-dir DIR .*\(default: /var/lib/cuzk-supervisor; {env}STATE_DIR\)", text
    )
    assert re.search(rf"--label LABEL .*\(default: empty; {env}LABEL\)", text)
    assert re.search(
        rf"--health-ladder STEP .*\(one of say, restart, tell; default: tell; {env}HEALTH_LADDER\)",
        text,
    )
    assert "--daemon-stop-grace-s SECONDS" in text
    assert "--manager-url URL" in text
    assert "--log-level LEVEL" in text


@pytest.mark.parametrize(
    "argv", [["config", "--max-w", "3"], ["plan", "--max-w", "3"], ["run", "--bench-c", "2"]]
)
def test_abbreviations_are_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "build_parser", build_parser)
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    assert stopped.value.code == exitcodes.USAGE
    assert f"unrecognized arguments: {' '.join(argv[1:])}" in capsys.readouterr().err


def test_a_wrong_flag_is_one_line_and_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(["run", "--worker", "3"])
    assert stopped.value.code == exitcodes.USAGE
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "cuzk-supervisor run: error: unrecognized arguments: --worker 3 (did you mean --workers?)",
        "usage: cuzk-supervisor run [options]  (see cuzk-supervisor run --help)",
    ]


def test_a_bad_value_for_an_own_flag_is_short_too(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["plan", "--host-gib", "lots"])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert err[0] == "cuzk-supervisor plan: error: argument --host-gib: invalid float value: 'lots'"


def _into_closed_pipe(*argv: str) -> subprocess.CompletedProcess[bytes]:
    """The command with stdout a pipe nobody reads any more (``| head -1`` once head is done)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(settings.ENV_PREFIX)}
        return subprocess.run(
            [sys.executable, "-m", "cuzk_supervisor", *argv],
            stdout=write_end, stderr=subprocess.PIPE, cwd=REPO, env=env, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)


@pytest.mark.parametrize("argv", [("config", "--json"), ("config",), ("plan", "--json")])
def test_a_closed_pipe_ends_quietly_with_141(argv: tuple[str, ...]) -> None:
    out = _into_closed_pipe(*argv)
    assert out.stderr.decode() == ""
    assert out.returncode == cli.CLOSED_PIPE == 128 + 13  # as if killed by SIGPIPE


def test_help_into_a_closed_pipe_is_quiet_too() -> None:
    out = _into_closed_pipe("run", "--help")  # argparse drops the failed write and exits 0
    assert (out.returncode, out.stderr.decode()) == (0, "")
