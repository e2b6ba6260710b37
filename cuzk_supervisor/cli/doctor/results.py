"""Doctor's results: a ``CheckResult`` per row, the overall verdict and exit status, the JSON
report, and the manager and listen checks' figures (the disk's are in ``core.disk``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cuzk_supervisor import exitcodes

MANAGER_TIMEOUT_S = 5.0
"""Longest the manager check waits (connect and read each); the setting's connect timeout wins
when it is shorter. A doctor run should take seconds, not a manager's full retry budget."""

UNIX_PATH_MAX = 107
"""Longest unix socket path the kernel binds (``sun_path`` is 108 bytes with the NUL)."""


class Verdict(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    verdict: Verdict
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "verdict": self.verdict.value, "detail": self.detail}


def ok(name: str, detail: str) -> CheckResult:
    return CheckResult(name, Verdict.OK, detail)


def warn(name: str, detail: str) -> CheckResult:
    return CheckResult(name, Verdict.WARN, detail)


def fail(name: str, detail: str) -> CheckResult:
    return CheckResult(name, Verdict.FAIL, detail)


def overall(results: Iterable[CheckResult]) -> Verdict:
    verdicts = {r.verdict for r in results}
    if Verdict.FAIL in verdicts:
        return Verdict.FAIL
    return Verdict.WARN if Verdict.WARN in verdicts else Verdict.OK


def exit_code(results: Iterable[CheckResult]) -> int:
    """0 when the machine can run the benchmark (``warn`` rows allowed), else 1 (FAILURE)."""
    return exitcodes.FAILURE if overall(results) is Verdict.FAIL else exitcodes.OK


def report(results: Sequence[CheckResult]) -> dict[str, Any]:
    return {
        "overall": overall(results).value,
        "exit_code": exit_code(results),
        "checks": [r.to_dict() for r in results],
    }
