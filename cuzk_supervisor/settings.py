"""Every setting of the supervisor: one frozen object, flag > environment > file > default.

Each field of ``Settings`` is declared once, with its default, help text and limits; the
command-line flags, the environment variables (prefix ``CUZK_SUPERVISOR_``), the TOML file keys,
the ``config`` dump and the README's table are all derived from these declarations. A bad value
is a ``UsageError`` naming the setting, the value, where it came from and what is allowed.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import shlex
import types
import typing
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from cuzk_supervisor.adapters.inputfile import read_toml
from cuzk_supervisor.address import check_public, parse_address
from cuzk_supervisor.errors import UsageError

ENV_PREFIX = "CUZK_SUPERVISOR_"
CONFIG_FILE_ENV = f"{ENV_PREFIX}CONFIG_FILE"
REDACTED = "***"

LOG_LEVELS = ("debug", "info", "warning", "error")


def setting(
    default: Any,
    help: str,
    *,
    secret: bool = False,
    choices: Sequence[str] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    form: str | None = None,
    max_length: int = 4096,
    group: str = "general",
) -> Any:
    """Declare one setting (a dataclass field with its documentation and limits).

    ``form`` names the text rule a str setting follows (see ``FORMS``); ``max_length`` bounds
    every text value (each item of a list)."""
    return field(
        default=default,
        metadata={
            "help": help,
            "secret": secret,
            "choices": tuple(choices) if choices else None,
            "minimum": minimum,
            "maximum": maximum,
            "form": form,
            "max_length": max_length,
            "group": group,
        },
    )


DAY_S = 86_400.0
HOUR_S = 3_600.0
# Longest raw value read from any source, before it is parsed (a list, a command, a URL).
MAX_RAW_CHARS = 16_384
# Longest settings file read (a few KB is a long one).
MAX_SETTINGS_FILE_BYTES = 1 << 20
MAX_LIST_ITEMS = 256


@dataclass(frozen=True)
class Settings:
    # --- identity and manager -------------------------------------------------------------
    label: str = setting(
        "",
        "instance label sent to /register (letters, digits and . _ : @ + -, at most 128); "
        "empty: VAST_CONTAINERLABEL",
        form="label",
        max_length=128,
        group="manager",
    )
    min_rate: float = setting(
        0.0,
        "minimum proofs/hour to pass the bench; 0: MIN_RATE, else the manager's default (50)",
        minimum=0,
        maximum=100_000,
        group="manager",
    )
    manager_url: str = setting(
        "",
        "fleet manager base URL (http or https); empty: local run, reports only logged",
        form="url",
        max_length=2048,
        group="manager",
    )
    manager_token: str = setting(
        "",
        "bearer token sent to the manager, for deployments behind an authenticating proxy",
        secret=True,
        form="token",
        group="manager",
    )
    manager_connect_timeout_s: float = setting(
        3.0, "connect timeout of one manager request", minimum=0.1, maximum=600, group="manager"
    )
    manager_read_timeout_s: float = setting(
        10.0, "read timeout of one manager request", minimum=0.1, maximum=3600, group="manager"
    )
    manager_retry_s: float = setting(
        120.0,
        "how long one report is retried before it is left in the outbox for later",
        minimum=1,
        maximum=DAY_S,
        group="manager",
    )
    status_interval_s: float = setting(
        60.0,
        "cadence of status lines pushed to the manager in long phases and the run phase",
        minimum=0.1,
        maximum=HOUR_S,
        group="manager",
    )
    running_ping_interval_s: float = setting(
        300.0,
        "cadence of the repeated /running in the run phase (each one is a line in the "
        "manager's own 5,000-line log, shared by the fleet)",
        minimum=1,
        maximum=DAY_S,
        group="manager",
    )
    log_push: bool = setting(True, "push log lines to the manager's log endpoint", group="manager")
    log_buffer_lines: int = setting(
        20_000,
        "log lines kept for the manager while it is away; the oldest are dropped past this",
        minimum=100,
        maximum=1_000_000,
        group="manager",
    )

    # --- files ------------------------------------------------------------------------------
    state_dir: Path = setting(
        Path("/var/lib/cuzk-supervisor"), "folder of the durable state file", group="files"
    )
    run_dir: Path = setting(
        Path("/run/cuzk-supervisor"),
        "folder of the rendered daemon config and its unix socket",
        group="files",
    )
    log_dir: Path = setting(
        Path("/var/log/cuzk-supervisor"), "folder of the daemon's rotating log", group="files"
    )
    log_level: str = setting("info", "supervisor log level", choices=LOG_LEVELS, group="files")
    log_format: str = setting(
        "auto",
        "auto: JSON lines off a terminal, colour on one",
        choices=("auto", "json", "console"),
        group="files",
    )

    # --- the daemon ---------------------------------------------------------------------------
    daemon_binary: str = setting(
        "cuzk", "daemon binary (path or name on PATH)", form="program", group="daemon"
    )
    daemon_args: tuple[str, ...] = setting(
        (), "extra arguments put before the daemon's own flags", group="daemon"
    )
    daemon_listen: str = setting(
        "",
        "daemon gRPC address, ip:port or unix:///path; empty: unix socket in run_dir "
        "(loopback only unless allow_public_listen)",
        form="optional_address",
        group="daemon",
    )
    daemon_status_listen: str = setting(
        "127.0.0.1:9821",
        "daemon's HTTP /status address (loopback only unless allow_public_listen)",
        form="address",
        group="daemon",
    )
    allow_public_listen: bool = setting(
        False,
        "allow a daemon_listen or daemon_status_listen that is not loopback or a unix socket "
        "(the daemon has no auth and no TLS: anyone who reaches it can use the GPU)",
        group="daemon",
    )
    daemon_param_cache: Path = setting(
        Path("/data/zk/params"), "parameters and PCE cache folder", group="daemon"
    )
    daemon_base_config: Path | None = setting(
        None, "operator's daemon TOML to merge (our keys win)", group="daemon"
    )
    daemon_log_level: str = setting(
        "info",
        "daemon log level or filter (e.g. info, or cuzk=debug,info)",
        form="log_filter",
        max_length=512,
        group="daemon",
    )
    daemon_log_max_bytes: int = setting(
        64 * 1024 * 1024, "size of the daemon log file before rotation", minimum=4096,
        maximum=1 << 40, group="daemon",
    )  # fmt: skip
    daemon_log_backups: int = setting(
        3, "rotated daemon log files kept", minimum=0, maximum=1000, group="daemon"
    )
    daemon_startup_deadline_s: float = setting(
        900.0,
        "time the daemon may take to answer GetStatus (the SRS load comes first)",
        minimum=1,
        maximum=DAY_S,
        group="daemon",
    )
    daemon_stop_grace_s: float = setting(
        10.0, "seconds between SIGTERM and SIGKILL", minimum=0, maximum=HOUR_S, group="daemon"
    )
    daemon_liveness_interval_s: float = setting(
        30.0,
        "GetStatus liveness probe cadence once ready (the daemon runs nvidia-smi for each)",
        minimum=0.1,
        maximum=HOUR_S,
        group="daemon",
    )
    daemon_liveness_timeout_s: float = setting(
        20.0, "deadline of one liveness probe", minimum=0.1, maximum=HOUR_S, group="daemon"
    )
    daemon_liveness_failures: int = setting(
        3, "missed probes in a row before a hung daemon is killed and restarted", minimum=1,
        maximum=1000, group="daemon",
    )  # fmt: skip
    restart_backoff_initial_s: float = setting(
        1.0, "first restart delay", minimum=0.01, maximum=HOUR_S, group="daemon"
    )
    restart_backoff_max_s: float = setting(
        60.0, "restart delay cap", minimum=0.01, maximum=DAY_S, group="daemon"
    )
    restart_stable_after_s: float = setting(
        600.0, "healthy this long resets the backoff", minimum=1, maximum=DAY_S, group="daemon"
    )
    crash_loop_failures: int = setting(
        5,
        "failures within the window that mean a crash loop",
        minimum=1,
        maximum=1000,
        group="daemon",
    )
    crash_loop_window_s: float = setting(
        300.0, "crash-loop window", minimum=1, maximum=DAY_S, group="daemon"
    )

    # --- proving ------------------------------------------------------------------------------
    submit_deadline_s: float = setting(
        60.0,
        "deadline of one SubmitProof call (uploads ~51 MB)",
        minimum=0.1,
        maximum=DAY_S,
        group="proving",
    )
    await_deadline_s: float = setting(
        30.0, "deadline of one AwaitProof call (awaited again when cut)", minimum=0.1,
        maximum=DAY_S, group="proving",
    )  # fmt: skip
    warmup_budget_s: float = setting(
        3600.0,
        "total time for the warmup proof (no PCE cache yet)",
        minimum=1,
        maximum=DAY_S,
        group="proving",
    )
    proof_budget_s: float = setting(
        1800.0, "total time for any other proof", minimum=1, maximum=DAY_S, group="proving"
    )
    c1_file: Path = setting(
        Path("/data/zk/c1.json"), "C1 input used for warmup, settle and bench proofs",
        group="proving",
    )  # fmt: skip

    # --- memory and plan ---------------------------------------------------------------------
    workers: int = setting(
        0, "partition_workers; 0: planned from memory", minimum=0, maximum=256, group="plan"
    )
    max_workers: int = setting(
        12, "most workers planned (more is slower)", minimum=1, maximum=256, group="plan"
    )
    warmup_workers: int = setting(
        2, "workers for the warmup proof", minimum=1, maximum=256, group="plan"
    )
    memory_base_gib: float = setting(
        69.0, "daemon RSS with SRS and PCE loaded", minimum=0, maximum=65_536, group="plan"
    )
    memory_per_worker_gib: float = setting(
        20.0, "peak RSS added by each partition worker", minimum=1, maximum=4096, group="plan"
    )
    memory_margin_fraction: float = setting(
        0.25,
        "share of the memory limit kept free (the rule's error at high worker counts)",
        minimum=0,
        maximum=0.9,
        group="plan",
    )
    memory_margin_min_gib: float = setting(
        4.0, "least memory kept free below the limit", minimum=0, maximum=65_536, group="plan"
    )
    proactive_oom: bool = setting(
        True, "stop and step down before the kernel's OOM killer acts", group="plan"
    )
    proc_root: Path = setting(Path("/proc"), "procfs root (tests point it at fixtures)",
                              group="plan")  # fmt: skip
    cgroup_root: Path | None = setting(
        None, "cgroup mount root; empty: found in /proc/self/mountinfo", group="plan"
    )
    gpu_probe: str = setting(
        "nvml", "GPU memory source", choices=("nvml", "sim", "none"), group="plan"
    )

    # --- lifecycle -----------------------------------------------------------------------------
    bench_count: int = setting(
        12, "proofs in the benchmark batch", minimum=1, maximum=10_000, group="bench"
    )
    bench_concurrency: int = setting(
        2, "benchmark proofs in flight", minimum=1, maximum=256, group="bench"
    )
    bench_budget_s: float = setting(
        2700.0,
        "the manager's benchmark budget (its 45 min timeout)",
        minimum=1,
        maximum=DAY_S,
        group="bench",
    )
    bench_min_proofs: int = setting(
        3,
        "completions a measurement needs; a bench interrupted with less reports a short rate",
        minimum=2,
        maximum=1000,
        group="bench",
    )
    bench_safety: float = setting(
        1.25,
        "estimated times are stretched by this before they are held against the budget",
        minimum=1,
        maximum=10,
        group="bench",
    )
    restart_after_warmup: bool = setting(
        True,
        "restart at full workers after the warmup (off for the budget release: it loses the PCE)",
        group="bench",
    )
    params_fetch_command: str = setting(
        "",
        "shell command that downloads the proof parameters; empty: none",
        form="command",
        group="bench",
    )
    params_expected: tuple[str, ...] = setting(
        (),
        "expected parameter files as NAME:BYTES (a file name in daemon_param_cache, at most "
        "1 TiB); all present: fetch skipped",
        form="expected_file",
        group="bench",
    )
    params_progress_interval_s: float = setting(
        10.0,
        "cadence of parameter download progress lines",
        minimum=0.1,
        maximum=HOUR_S,
        group="bench",
    )
    params_timeout_s: float = setting(
        5400.0,
        "longest the fetch command may run (the manager kills at 90 min in registered)",
        minimum=1,
        maximum=DAY_S,
        group="bench",
    )
    rate_time_scale: float = setting(
        1.0,
        "daemon seconds per wall second: rates are reported in the daemon's clock (the "
        "simulator's --time-scale; 1 on real hardware)",
        minimum=0.001,
        maximum=1_000_000,
        group="bench",
    )
    plan_memory_scale: float = setting(
        1.0,
        "planned bytes per measured byte (1024 against the simulator's 1 MiB per GiB)",
        minimum=0.001,
        maximum=1_000_000,
        group="plan",
    )
    worker_commands: tuple[str, ...] = setting(
        (),
        "shell commands supervised beside the daemon in the run phase",
        form="command",
        group="bench",
    )
    exit_after_run: bool = setting(
        False, "exit once the run phase is reached (demos and tests)", group="bench"
    )

    # --- health server ----------------------------------------------------------------------
    health_enabled: bool = setting(True, "serve /healthz /readyz /metrics", group="health")
    health_listen: str = setting(
        "127.0.0.1:9822",
        "health server address, ip:port (loopback by default)",
        form="health_listen",
        group="health",
    )
    health_allow_public: bool = setting(
        False,
        "allow a non-loopback health_listen (e.g. 0.0.0.0 in a pod, for the kubelet's probes)",
        group="health",
    )

    def __post_init__(self) -> None:
        if self.warmup_workers > self.max_workers:
            raise UsageError(
                f"setting warmup_workers={self.warmup_workers}: must be <= max_workers "
                f"({self.max_workers})"
            )
        if self.restart_backoff_max_s < self.restart_backoff_initial_s:
            raise UsageError(
                f"setting restart_backoff_max_s={self.restart_backoff_max_s:g}: must be >= "
                f"restart_backoff_initial_s ({self.restart_backoff_initial_s:g})"
            )
        if self.manager_url and urlsplit(self.manager_url).scheme not in ("http", "https"):
            raise UsageError(
                f"setting manager_url={redact_url(self.manager_url)!r}: must be an http(s) URL"
            )
        for name in ("daemon_listen", "daemon_status_listen"):
            # The daemon has no auth and no TLS: public only when the operator asks.
            public_listen_warning(self, name)
        for name in ("params_expected",):
            for entry in getattr(self, name):
                _, sep, size = entry.rpartition(":")
                if not sep or not size.isdigit():
                    raise UsageError(f"setting {name}: {entry!r} is not NAME:BYTES")


def public_listen_warning(s: Settings, name: str) -> str | None:
    """For a daemon address setting: UsageError when public and not allowed, the warning to
    log when public and allowed (``allow_public_listen``), None when loopback or unset."""
    listen: str = getattr(s, name)
    if not listen:
        return None  # the unix socket in run_dir
    return check_public(
        name,
        listen,
        is_loopback=parse_address(listen).is_loopback,
        allow_public=s.allow_public_listen,
        allow_setting="allow_public_listen",
    )


# --- declarations -> parsing ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Declared:
    name: str
    kind: str  # str, int, float, bool, path, optional_path, list
    default: Any
    help: str
    secret: bool
    choices: tuple[str, ...] | None
    minimum: float | None
    maximum: float | None
    group: str
    form: str | None = None
    max_length: int = 4096

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _kind(hint: Any) -> str:
    if hint is bool:
        return "bool"
    if hint in (int, float, str):
        return hint.__name__
    if hint is Path:
        return "path"
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union) and Path in typing.get_args(hint):
        return "optional_path"
    if origin is tuple:
        return "list"
    raise TypeError(f"unsupported setting type {hint!r}")


def declarations() -> list[Declared]:
    hints = typing.get_type_hints(Settings)
    return [
        Declared(
            name=f.name,
            kind=_kind(hints[f.name]),
            default=f.default,
            help=f.metadata["help"],
            secret=f.metadata["secret"],
            choices=f.metadata["choices"],
            minimum=f.metadata["minimum"],
            maximum=f.metadata["maximum"],
            group=f.metadata["group"],
            form=f.metadata["form"],
            max_length=f.metadata["max_length"],
        )
        for f in dataclasses.fields(Settings)
    ]


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _allowed(decl: Declared) -> str:
    if decl.choices:
        return "one of " + ", ".join(decl.choices)
    limits = []
    if decl.minimum is not None:
        limits.append(f">= {decl.minimum:g}")
    if decl.maximum is not None:
        limits.append(f"<= {decl.maximum:g}")
    noun = {
        "bool": "true or false",
        "int": "an integer",
        "float": "a number",
        "path": "a path",
        "optional_path": "a path or empty",
        "list": "a list (TOML array, or a shell-quoted string)",
        "str": "text",
    }[decl.kind]
    return noun + (" " + " and ".join(limits) if limits else "")


def _shown(decl: Declared, value: Any) -> str:
    """A value as an error shows it: redacted when secret, one line, at most ~60 characters."""
    if decl.secret:
        return REDACTED
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


def _bad(decl: Declared, value: Any, source: str, why: str | None = None) -> UsageError:
    shown = _shown(decl, value)
    reason = why or f"must be {_allowed(decl)}"
    return UsageError(f"setting {decl.name} = {shown} (from {source}): {reason}")


def _raw_problem(decl: Declared, raw: Any) -> str | None:
    """Checks on the raw value, before it is parsed: size and encoding."""
    texts: list[str] = []
    if isinstance(raw, str):
        texts = [raw]
    elif isinstance(raw, list | tuple):
        if len(raw) > MAX_LIST_ITEMS:
            return f"a list of {len(raw)} items, more than {MAX_LIST_ITEMS}"
        texts = [item for item in raw if isinstance(item, str)]
    if sum(len(text) for text in texts) > MAX_RAW_CHARS:
        return f"longer than {MAX_RAW_CHARS} characters"
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a non-UTF-8 byte, kept by Python as a lone surrogate
            return "not valid UTF-8"
    return None


def parse_value(decl: Declared, raw: Any, source: str) -> Any:
    """Text (flag, env) or a TOML value → the setting's typed value, checked against limits."""
    problem = _raw_problem(decl, raw)
    if problem is not None:
        # Not shown: an undecodable or huge value does not belong in a one-line error.
        raise UsageError(f"setting {decl.name} (from {source}): {problem}")
    try:
        value = _convert(decl, raw)
    except (ValueError, TypeError):
        raise _bad(decl, raw, source) from None
    if decl.choices and value not in decl.choices:
        raise _bad(decl, raw, source)
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise _bad(decl, raw, source)
        if decl.minimum is not None and value < decl.minimum:
            raise _bad(decl, raw, source)
        if decl.maximum is not None and value > decl.maximum:
            raise _bad(decl, raw, source)
    problem = _value_problem(decl, value)
    if problem is not None:
        if problem.startswith(f"bad {decl.name} "):  # already a whole line naming the setting
            raise UsageError(problem)
        raise _bad(decl, raw, source, problem)
    return value


# --- text rules -------------------------------------------------------------------------------

_LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]*")
_LOG_FILTER_RE = re.compile(r"[A-Za-z][A-Za-z0-9_:=,.-]*")
_TOKEN_RE = re.compile(r"[\x21-\x7e]+")  # visible ASCII: a header value, no space, no CR/LF


def _control(text: str) -> bool:
    """A control character (newline, tab, NUL, escape, DEL, C1) or a line/paragraph separator."""
    return any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in text)


def _path_problem(path: Path) -> str | None:
    text = str(path)
    if _control(text):
        return "a path without control characters"
    if text.startswith("-"):
        return "a path, not starting with '-'"
    if any(len(part.encode()) > 255 for part in path.parts):
        return "a path whose names are at most 255 bytes"
    return None


def _form_problem(form: str, text: str) -> str | None:
    """Why ``text`` breaks the rule ``form`` (None when it keeps it). Empty text is checked
    by the caller (each form says whether it may be empty)."""
    if form == "label":
        if not _LABEL_RE.fullmatch(text):
            return "letters, digits and . _ : @ + - (starting with a letter or digit)"
    elif form == "url":
        return _url_problem(text)
    elif form == "token":
        if not _TOKEN_RE.fullmatch(text):
            return "visible ASCII characters (no spaces, no newlines)"
    elif form in ("address", "optional_address"):
        try:
            parse_address(text)
        except UsageError as exc:
            return str(exc)
    elif form == "health_listen":
        from cuzk_supervisor.serve.health import parse_listen

        try:
            parse_listen(text)
        except UsageError as exc:
            return str(exc)
    elif form == "log_filter":
        if not _LOG_FILTER_RE.fullmatch(text):
            return "a log level or filter: letters, digits and _ : = , . -"
    elif form in ("program", "command"):
        if text.strip().startswith("-"):
            return "a command, not starting with '-'"
        if not text.strip():
            return "a command, not blank"
    elif form == "expected_file":
        name, sep, size = text.rpartition(":")
        if not sep or not size.isdigit() or not name:
            return "NAME:BYTES"
        if "/" in name or name in (".", "..") or name.startswith("-"):
            return "NAME:BYTES with NAME a plain file name"
        if int(size) > 1 << 40:
            return "NAME:BYTES with BYTES at most 1 TiB"
    return None


def _url_problem(text: str) -> str | None:
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises ValueError on a bad port)
    except ValueError:
        return "an http(s) URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an http(s) URL"
    if any(ch.isspace() for ch in text):
        return "an http(s) URL without spaces"
    return None


_MAY_BE_EMPTY = {None, "label", "url", "token", "optional_address", "command"}


def _value_problem(decl: Declared, value: Any) -> str | None:
    """The text rules: every text without control characters and within its length; each form
    its own rule."""
    if decl.kind == "path":
        return _path_problem(value)
    if decl.kind == "optional_path":
        return None if value is None else _path_problem(value)
    if decl.kind == "list":
        items: tuple[str, ...] = value
        for item in items:
            if _control(item):
                return "a list of texts without control characters (newlines, tabs, NUL)"
            if len(item) > decl.max_length:
                return f"a list of texts of at most {decl.max_length} characters each"
            if decl.form is not None:
                problem = _form_problem(decl.form, item)
                if problem is not None:
                    return f"a list, each item {problem}"
        return None
    if decl.kind != "str" or decl.choices:
        return None
    text: str = value
    if _control(text):
        return "text without control characters (newlines, tabs, NUL)"
    if len(text) > decl.max_length:
        return f"text of at most {decl.max_length} characters"
    if not text:
        return None if decl.form in _MAY_BE_EMPTY else "not empty"
    return None if decl.form is None else _form_problem(decl.form, text)


def _convert(decl: Declared, raw: Any) -> Any:
    kind = decl.kind
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError(raw)
    if kind == "int":
        if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
            raise ValueError(raw)
        return int(str(raw).strip()) if not isinstance(raw, int | float) else int(raw)
    if kind == "float":
        if isinstance(raw, bool):
            raise ValueError(raw)
        return float(raw)
    # Text settings take text only: a TOML number, date or table is not a label or a path.
    if kind == "path":
        if not isinstance(raw, str) or not raw.strip():
            raise ValueError(raw)
        return Path(raw)
    if kind == "optional_path":
        if not isinstance(raw, str):
            raise TypeError(raw)
        return Path(raw) if raw.strip() else None
    if kind == "list":
        if isinstance(raw, list | tuple):
            if not all(isinstance(item, str) for item in raw):
                raise TypeError(raw)
            return tuple(raw)
        if not isinstance(raw, str):
            raise TypeError(raw)
        return tuple(shlex.split(raw))
    if not isinstance(raw, str):
        raise TypeError(raw)
    return raw


# --- sources --------------------------------------------------------------------------------


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, grouped; unset flags stay absent so lower sources show through."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    parser.add_argument(
        "--config-file",
        default=argparse.SUPPRESS,
        help=f"TOML settings file (env {CONFIG_FILE_ENV})",
    )
    for decl in declarations():
        group = groups.setdefault(decl.group, parser.add_argument_group(f"{decl.group} settings"))
        help_text = f"{decl.help} (env {decl.env}; default {format_value(decl, decl.default)})"
        if decl.kind == "bool":
            group.add_argument(
                decl.flag,
                dest=decl.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            group.add_argument(
                decl.flag, dest=decl.name, default=argparse.SUPPRESS, metavar="V", help=help_text
            )


def _file_values(path: Path) -> dict[str, Any]:
    document = read_toml(path, what="settings file", max_bytes=MAX_SETTINGS_FILE_BYTES)
    flat: dict[str, Any] = {}
    for key, value in document.items():
        if isinstance(value, dict):  # [daemon] binary = ... is daemon_binary
            for inner, inner_value in value.items():
                flat[f"{key}_{inner}"] = inner_value
        else:
            flat[key] = value
    known = {decl.name for decl in declarations()}
    unknown = sorted(set(flat) - known)
    if unknown:
        raise UsageError(f"settings file {path}: unknown setting(s) {', '.join(unknown)}")
    return flat


@dataclass(frozen=True, slots=True)
class Loaded:
    settings: Settings
    sources: dict[str, str]  # setting name -> "flag", "env CUZK_…", "file PATH" or "default"


def load(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Loaded:
    """Resolve every setting: flag > environment > file > default; validate the whole."""
    flags = dict(flags or {})
    environ = os.environ if environ is None else environ
    config_file = flags.pop("config_file", None) or environ.get(CONFIG_FILE_ENV) or None
    if config_file is not None:
        config_decl = Declared("config_file", "path", None, "", False, None, None, None, "")
        parse_value(config_decl, config_file, f"env {CONFIG_FILE_ENV} or --config-file")
    from_file = _file_values(Path(config_file)) if config_file else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for decl in declarations():
        if decl.name in flags:
            values[decl.name] = parse_value(decl, flags[decl.name], f"flag {decl.flag}")
            sources[decl.name] = "flag"
        elif decl.env in environ:
            values[decl.name] = parse_value(decl, environ[decl.env], f"env {decl.env}")
            sources[decl.name] = f"env {decl.env}"
        elif decl.name in from_file:
            values[decl.name] = parse_value(decl, from_file[decl.name], f"file {config_file}")
            sources[decl.name] = f"file {config_file}"
        else:
            values[decl.name] = decl.default
            sources[decl.name] = "default"
    return Loaded(Settings(**values), sources)


def from_namespace(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Loaded:
    names = {decl.name for decl in declarations()} | {"config_file"}
    return load({k: v for k, v in vars(args).items() if k in names}, environ)


# --- dumping --------------------------------------------------------------------------------


def redact_url(url: str) -> str:
    """Drop the password (and query, which may carry tokens) from a URL for display."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", f":{REDACTED}@")
    query = REDACTED if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def format_value(decl: Declared, value: Any) -> str:
    if decl.secret and value:
        return REDACTED
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return shlex.join(value)
    if decl.name.endswith("_url") and value:
        return redact_url(str(value))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def dump(loaded: Loaded) -> list[tuple[str, str, str]]:
    """(name, shown value, source) for every setting, secrets redacted."""
    return [
        (
            decl.name,
            format_value(decl, getattr(loaded.settings, decl.name)),
            loaded.sources[decl.name],
        )
        for decl in declarations()
    ]


def markdown_table() -> str:
    """The README's configuration reference, generated from the declarations."""
    lines = [
        "| setting | flag | environment | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for decl in declarations():
        default = format_value(decl, decl.default) or "(empty)"
        help_text = decl.help.replace("|", "\\|")
        if decl.choices:
            help_text += f" ({', '.join(decl.choices)})"
        if decl.minimum is not None or decl.maximum is not None:
            low = "" if decl.minimum is None else f"{decl.minimum:g}"
            high = "" if decl.maximum is None else f"{decl.maximum:g}"
            help_text += f"; range {low}–{high}"
        if decl.secret:
            help_text += "; secret: redacted in every dump"
        lines.append(
            f"| `{decl.name}` | `{decl.flag}` | `{decl.env}` | `{default}` | {help_text} |"
        )
    return "\n".join(lines)
