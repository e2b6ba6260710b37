"""``Settings``: every setting of the supervisor, one frozen object, assembled from its groups.

The fields are declared by role: the edges' (``edgefields``: manager, logging, folders, daemon),
the machine's (``machinefields``: supervision, memory), the phases' (``phasefields``: proving,
params, bench, run), and here the health server's. Here too: the checks that span settings
(``__post_init__``) and the daemon addresses' public check.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from cuzk_supervisor.address import check_public, parse_address
from cuzk_supervisor.core.checks import Comparison, compares
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.settings.declare import redact_url, setting
from cuzk_supervisor.settings.edgefields import EdgeFields
from cuzk_supervisor.settings.machinefields import MachineFields
from cuzk_supervisor.settings.phasefields import PhaseFields


# The bases are listed last group first: a dataclass takes its bases' fields in reverse method
# resolution order, so the edges' come first, then the machine's, the phases', and this class's
# own. That order is the flags', the ``config`` dump's and docs/configuration.md's.
@dataclass(frozen=True)
class Settings(PhaseFields, MachineFields, EdgeFields):
    # --- health server ------------------------------------------------------------------------
    health_enabled: bool = setting(True, "serve /healthz /readyz /metrics", group="health")
    health_listen: str = setting(
        "127.0.0.1:9822", "health server address, ip:port", form="health_listen", group="health"
    )
    health_allow_public: bool = setting(
        False,
        "allow a non-loopback health_listen (e.g. 0.0.0.0 in a pod, for the kubelet's probes)",
        group="health",
    )

    def __post_init__(self) -> None:
        for name, relation, other, why in RELATIONS:
            value, bound = getattr(self, name), getattr(self, other)
            if not compares(value, relation, bound):
                raise UsageError(
                    f"setting {name}={value:g}: must be {relation} {other} ({bound:g}){why}"
                )
        if self.manager_url and urlsplit(self.manager_url).scheme not in ("http", "https"):
            raise UsageError(
                f"setting manager_url={redact_url(self.manager_url)!r}: must be an http(s) URL"
            )
        for name in ("daemon_listen", "daemon_status_listen"):
            # The daemon has no auth and no TLS: public only when the operator asks.
            public_listen_warning(self, name)
        for entry in self.params_expected:
            _, sep, size = entry.rpartition(":")
            if not sep or not size.isdigit():
                raise UsageError(f"setting params_expected: {entry!r} is not NAME:BYTES")


# (setting, relation, other setting, why): checked once each is within its own range.
RELATIONS: tuple[tuple[str, Comparison, str, str], ...] = (
    ("warmup_workers", "<=", "max_workers", ""),
    ("restart_backoff_max_s", ">=", "restart_backoff_initial_s", ""),
    ("manager_backoff_max_s", ">=", "manager_backoff_initial_s", ""),
    ("memory_alert_sample_interval_s", "<=", "memory_sample_interval_s",
     "; memory at risk is sampled more often"),
)  # fmt: skip


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
