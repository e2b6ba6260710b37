"""Where a process's memory goes: its resident pages by mapping, and its imports by package.

``resident(pid)`` reads ``/proc/PID/smaps`` once: the RSS of each shared library (gRPC's
``cygrpc``, ``libpython``, OpenSSL's ``libcrypto`` and ``libssl``, the others together), of the
anonymous and ``[heap]`` mappings (Python's objects and every ``malloc``: the interpreter's own
arenas, gRPC's buffers), and of the threads' stacks (anonymous mappings of the stack size
``RLIMIT_STACK`` gives each thread, and ``[stack]``). The parts add up to the RSS.

``floor()`` is a reference: the RSS of a bare interpreter that holds only what the run phase
cannot do without (asyncio, which loads ssl; structlog without rich; psutil; grpc.aio with the
proving stubs, one channel used), nothing of the supervisor; ``floor(with_grpc=False)`` the
same less grpc (protobuf and the proving messages kept): what a run phase that reached the
daemon without grpcio could not go below.

``imports_by_package(modules)`` imports ``modules`` (the names a run had in ``sys.modules``) in a
fresh interpreter, a package at a time, and reports what each package added to its RSS: the
standard library first, then the third-party packages, then ours by sub-package. An estimate:
what a package adds depends on what came before it (shared dependencies count once, for the
first), and the run's own data (its buffers, its threads) is not in it.
``imports_without_grpc(modules)`` does the same with grpc made unimportable: what the same code
would hold in a process that never loaded grpcio, and which modules cannot do without it.
"""

from __future__ import annotations

import json
import re
import resource
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from _harness import PY, BenchError

MIB = 1 << 20
_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$")
LIBRARIES = (
    ("gRPC (cygrpc)", "cygrpc"),
    ("libpython", "libpython"),
    ("OpenSSL (libcrypto, libssl)", "libcrypto"),
    ("OpenSSL (libcrypto, libssl)", "libssl"),
)


@dataclass
class Resident:
    """RSS in bytes by where it lies."""

    libraries: dict[str, int] = field(default_factory=dict)
    heap: int = 0
    stacks: int = 0
    threads: int = 0

    @property
    def total(self) -> int:
        return sum(self.libraries.values()) + self.heap + self.stacks


def _library(path: str) -> str:
    for label, marker in LIBRARIES:
        if marker in path:
            return label
    return "other files (shared libraries, locale)"


def resident(pid: int) -> Resident:
    """The RSS of ``pid`` by where it lies (see the module's docstring)."""
    stack_size = resource.getrlimit(resource.RLIMIT_STACK)[0]
    out = Resident()
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
        out.threads = len(list(Path(f"/proc/{pid}/task").iterdir()))
    except OSError as exc:
        raise BenchError(f"cannot read the memory map of {pid}: {exc}") from None
    where = ""
    for line in text.splitlines():
        found = _MAPPING.match(line)
        if found is not None:
            lo, hi, path = int(found.group(1), 16), int(found.group(2), 16), found.group(4)
            if path == "[stack]" or (not path and hi - lo == stack_size > 0):
                where = "stack"
            elif path.startswith("/"):
                where = _library(path)
            else:
                where = "heap"  # anonymous, [heap], [vdso] ...: what the process allocated
        elif line.startswith("Rss:"):
            size = int(line.split()[1]) * 1024
            if where == "stack":
                out.stacks += size
            elif where == "heap":
                out.heap += size
            else:
                out.libraries[where] = out.libraries.get(where, 0) + size
    return out


THIRD_PARTY = {
    "grpc": "grpc + protobuf", "google": "grpc + protobuf", "structlog": "structlog",
    "psutil": "psutil", "tenacity": "tenacity", "tomli_w": "tomli_w",
    "httpx": "httpx (+ httpcore, anyio, h11, idna, certifi, sniffio)",
    **dict.fromkeys(("httpcore", "anyio", "h11", "idna", "certifi", "sniffio"),
                    "httpx (+ httpcore, anyio, h11, idna, certifi, sniffio)"),
}  # fmt: skip
PACKAGES = frozenset(
    f"cuzk_supervisor.{p}"
    for p in ("adapters", "cli", "core", "daemon", "lifecycle", "proto", "serve", "settings", "sim")
)
_IMPORTER = """\
import importlib, json, os, sys
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
groups, blocked = json.loads(sys.stdin.read())
sys.modules.setdefault("rich", None)  # as the supervisor imports structlog (logimport)
for name in blocked:
    sys.modules[name] = None  # its import fails, and so does every module's that needs it
out = [["interpreter", rss()]]
failed = []
for name, modules in groups:
    before = rss()
    for module in modules:
        if module not in sys.modules:
            try:
                importlib.import_module(module)
            except Exception:
                failed.append(module)
    out.append([name, rss() - before])
print(json.dumps([out, failed]))
"""


def _group(module: str) -> str:
    top = module.split(".")[0]
    if top == "cuzk_supervisor":
        parts = module.split(".")
        package = parts[1] if len(parts) > 2 or module in PACKAGES else "top-level modules"
        return f"ours: {package}"
    if top in THIRD_PARTY:
        return THIRD_PARTY[top]
    return "standard library"


def _import_fresh(
    modules: list[str], blocked: tuple[str, ...] = ()
) -> tuple[list[tuple[str, int]], list[str]]:
    """Import ``modules`` into a fresh interpreter, a package at a time, with the ``blocked``
    packages made unimportable: what each package added to its RSS, in the order imported, and
    the modules that failed to import."""
    groups: dict[str, list[str]] = {}
    for module in modules:
        if module != "__main__" and not module.startswith(("_cython", "cython_runtime")):
            groups.setdefault(_group(module), []).append(module)
    first = ["standard library", *dict.fromkeys(THIRD_PARTY.values())]
    order = [g for g in first if g in groups] + sorted(g for g in groups if g not in first)
    payload = json.dumps([[[g, groups[g]] for g in order], list(blocked)])
    done = subprocess.run([PY, "-c", _IMPORTER], input=payload, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    try:
        sizes, failed = json.loads(done.stdout)
        return [(str(name), int(size)) for name, size in sizes], [str(m) for m in failed]
    except ValueError:
        raise BenchError(f"imports by package: {done.stderr[-300:]!r}") from None


def imports_by_package(modules: list[str]) -> list[tuple[str, int]]:
    """(package, bytes of RSS its import added), in the order imported (see the docstring)."""
    return _import_fresh(modules)[0]


def imports_without_grpc(modules: list[str]) -> tuple[int, list[str]]:
    """The RSS (bytes) of a fresh interpreter that imported ``modules`` with grpc blocked, and
    the modules that could not be imported without it: what the same code would hold in a run
    phase that never loaded grpcio."""
    sizes, failed = _import_fresh([m for m in modules if m.split(".")[0] != "grpc"], ("grpc",))
    return sum(size for _, size in sizes), failed


_FLOOR = """\
import asyncio, os, sys
sys.modules["rich"] = None  # as the supervisor imports structlog (logimport)
import structlog
del sys.modules["rich"]
import psutil
WITH_GRPC = {with_grpc}
if WITH_GRPC:
    import grpc, grpc.aio
    from cuzk_supervisor.proto import proving_pb2_grpc
else:
    from cuzk_supervisor.proto import proving_pb2
async def main():
    if not WITH_GRPC:
        return  # the loop run, nothing else
    channel = grpc.aio.insecure_channel("127.0.0.1:9")
    proving_pb2_grpc.ProvingEngineStub(channel)
    try:
        await asyncio.wait_for(channel.channel_ready(), 0.3)
    except (asyncio.TimeoutError, grpc.RpcError):
        pass
    await channel.close()
asyncio.run(main())
with open("/proc/self/statm") as f:
    print(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
"""


def floor(*, with_grpc: bool = True) -> int:
    """The RSS (bytes) of the reference process (see the module's docstring); without grpc:
    the same less grpc (protobuf and the proving messages kept), the floor of a run phase that
    would reach the daemon without grpcio."""
    script = _FLOOR.replace("{with_grpc}", str(with_grpc))
    done = subprocess.run([PY, "-c", script], capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    try:
        return int(done.stdout.split()[-1])
    except (IndexError, ValueError):
        raise BenchError(f"floor: {done.stderr[-300:]!r}") from None
