"""Regenerate the gRPC stubs from ``protos/`` (run ``make protos``).

grpcio-tools writes ``from cuzk.v1 import proving_pb2``; we rewrite that single import so the
stubs live inside this package instead of needing ``cuzk`` on ``sys.path``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parents[2] / "protos"
PROTO_FILE = "cuzk/v1/proving.proto"
PACKAGE_DIR = Path(__file__).resolve().parent
GENERATED = ("proving_pb2.py", "proving_pb2.pyi", "proving_pb2_grpc.py")
_UPSTREAM_IMPORT = "from cuzk.v1 import proving_pb2"
_PACKAGE_IMPORT = "from cuzk_supervisor.proto import proving_pb2"


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) and write the three stub files into ``out_dir``."""
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        include = str(Path(protoc.__file__).parent / "_proto")
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            PROTO_FILE,
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed for {PROTO_ROOT / PROTO_FILE}")
        written = []
        for name in GENERATED:
            text = (Path(tmp) / "cuzk" / "v1" / name).read_text()
            target = out_dir / name
            target.write_text(text.replace(_UPSTREAM_IMPORT, _PACKAGE_IMPORT))
            written.append(target)
    return written


def main() -> int:
    for path in generate(PACKAGE_DIR):
        print(f"wrote {path.relative_to(PACKAGE_DIR.parents[1])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
