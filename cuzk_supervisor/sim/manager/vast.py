"""The platform's CLI as the real manager runs it (``--vastai PROG``): ``create instance`` for
``POST /api/deploy``, ``show instances --raw`` for the sweep, ``destroy instance`` where a
container is destroyed. Every command is an argv list (no shell)."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

DEFAULT_IMAGE = "magik6k/curio-cuzk:latest"  # the real manager's fixed name
DEFAULT_MIN_RATE = 30.0
DISK_GB = 250
ONSTART_CMD = "nohup /usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &"
CREATE_TIMEOUT = 120.0
SHOW_TIMEOUT = 120.0
DESTROY_TIMEOUT = 120.0
REASON_MAX = 200
_NEW_CONTRACT_RE = re.compile(r"""['"]new_contract['"]\s*:\s*(\d+)""")
_FAILED_RE = re.compile(r"""['"]success['"]\s*:\s*(False|false)""")


class VastError(Exception):
    """A ``vastai`` command that failed; the message is a short reason."""


def new_contract(stdout: str) -> int | None:
    """The instance id in ``Started. {'success': True, 'new_contract': 7835610}`` (text
    around it tolerated, Python-dict repr or JSON); None when absent or not a success."""
    match = _NEW_CONTRACT_RE.search(stdout)
    if match is None or _FAILED_RE.search(stdout):
        return None
    return int(match.group(1))


def _short(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return last if len(last) <= REASON_MAX else last[: REASON_MAX - 3] + "..."


@dataclass(frozen=True, slots=True)
class VastCLI:
    prog: str
    image: str = DEFAULT_IMAGE

    def create_argv(self, offer_id: int, min_rate: float, pavail: str, server: str) -> list[str]:
        env = f"-e PAVAIL={pavail} -e PAVAIL_SERVER={server} -e MIN_RATE={min_rate:.1f}"
        return [
            self.prog,
            "create",
            "instance",
            str(offer_id),
            "--image",
            self.image,
            "--disk",
            str(DISK_GB),
            "--env",
            env,
            "--ssh",
            "--direct",
            "--onstart-cmd",
            ONSTART_CMD,
        ]

    def _run(self, argv: list[str], timeout: float) -> str:
        """stdout of ``argv``; VastError (short reason) on a start failure, a timeout or a
        non-zero exit."""
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise VastError(f"timed out after {timeout:g}s") from None
        except OSError as exc:
            raise VastError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
        if done.returncode != 0:
            detail = _short(done.stderr) or _short(done.stdout)
            raise VastError(f"exit status {done.returncode}" + (f": {detail}" if detail else ""))
        return done.stdout

    def create(
        self, offer_id: int, min_rate: float, pavail: str, server: str, timeout: float
    ) -> int:
        """The new instance's id; VastError otherwise (``pavail`` never in the reason)."""
        argv = self.create_argv(offer_id, min_rate, pavail, server)
        try:
            stdout = self._run(argv, timeout)
            instance_id = new_contract(stdout)
            if instance_id is None:
                raise VastError(f"no new_contract in output: {_short(stdout) or '(empty)'}")
        except VastError as exc:
            reason = str(exc)
            raise VastError(reason.replace(pavail, "***") if pavail else reason) from None
        return instance_id

    def show_instances(self) -> str:
        """``show instances --raw``'s stdout; ValueError when the command fails."""
        try:
            return self._run([self.prog, "show", "instances", "--raw"], SHOW_TIMEOUT)
        except VastError as exc:
            raise ValueError(f"vastai show instances: {exc}") from None

    def destroy(self, instance_id: int) -> None:
        """``destroy instance ID``; VastError when it fails."""
        self._run([self.prog, "destroy", "instance", str(instance_id)], DESTROY_TIMEOUT)
