"""The committed stubs match the real daemon's wire contract and the committed .proto.

The expected contract below was typed from ``docs/daemon.md``, not from the .proto,
so a slip in either shows up as a difference here.
"""

from __future__ import annotations

import ast
import difflib
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor

from cuzk_supervisor.proto import proving_pb2, proving_pb2_grpc
from cuzk_supervisor.proto.generate import GENERATED, PACKAGE_DIR, generate

PACKAGE = "cuzk.v1"
SERVICE = "ProvingEngine"

# name -> {field: (number, type)}; a type is a scalar name, an enum or message name (nested ones as
# "Outer.Inner"), with "repeated " in front for repeated fields.
MESSAGES: dict[str, dict[str, tuple[int, str]]] = {
    "SubmitProofRequest": {
        "request_id": (1, "string"),
        "proof_kind": (2, "ProofKind"),
        "sector_size": (3, "uint64"),
        "registered_proof": (4, "uint64"),
        "priority": (5, "Priority"),
        "vanilla_proof": (10, "bytes"),
        "vanilla_proofs": (11, "repeated bytes"),
        "sector_number": (20, "uint64"),
        "miner_id": (21, "uint64"),
        "randomness": (22, "bytes"),
        "partition_index": (23, "uint32"),
        "comm_r_old": (30, "bytes"),
        "comm_r_new": (31, "bytes"),
        "comm_d_new": (32, "bytes"),
    },
    "SubmitProofResponse": {
        "job_id": (1, "string"),
        "queue_position": (2, "uint32"),
        "assigned_gpu": (3, "string"),
    },
    "AwaitProofRequest": {
        "job_id": (1, "string"),
        "timeout_ms": (2, "uint64"),
    },
    "AwaitProofResponse": {
        "job_id": (1, "string"),
        "status": (2, "AwaitProofResponse.Status"),
        "proof": (3, "bytes"),
        "error_message": (4, "string"),
        "queue_wait_ms": (10, "uint64"),
        "srs_load_ms": (11, "uint64"),
        "synthesis_ms": (12, "uint64"),
        "gpu_compute_ms": (13, "uint64"),
        "total_ms": (14, "uint64"),
    },
    "ProveRequest": {"submit": (1, "SubmitProofRequest")},
    "ProveResponse": {"result": (1, "AwaitProofResponse")},
    "CancelProofRequest": {"job_id": (1, "string")},
    "CancelProofResponse": {"was_running": (1, "bool")},
    "GetStatusRequest": {},
    "GetStatusResponse": {
        "gpus": (1, "repeated GPUStatus"),
        "loaded_srs": (2, "repeated SRSStatus"),
        "queues": (3, "repeated QueueStatus"),
        "total_proofs_completed": (4, "uint64"),
        "total_proofs_failed": (5, "uint64"),
        "uptime_seconds": (6, "uint64"),
        "pinned_memory_bytes": (7, "uint64"),
        "pinned_memory_limit_bytes": (8, "uint64"),
    },
    "GPUStatus": {
        "ordinal": (1, "uint32"),
        "name": (2, "string"),
        "vram_total_bytes": (3, "uint64"),
        "vram_free_bytes": (4, "uint64"),
        "current_job_id": (5, "string"),
        "current_proof_kind": (6, "string"),
    },
    "SRSStatus": {
        "circuit_id": (1, "string"),
        "tier": (2, "SRSStatus.Tier"),
        "size_bytes": (3, "uint64"),
        "ref_count": (4, "uint32"),
    },
    "QueueStatus": {
        "proof_kind": (1, "string"),
        "pending": (2, "uint32"),
        "in_progress": (3, "uint32"),
    },
    "PreloadSrsRequest": {"circuit_id": (1, "string")},
    "PreloadSrsResponse": {
        "already_loaded": (1, "bool"),
        "load_time_ms": (2, "uint64"),
    },
    "EvictSrsRequest": {"circuit_id": (1, "string")},
    "EvictSrsResponse": {
        "was_loaded": (1, "bool"),
        "freed_bytes": (2, "uint64"),
    },
    "GetMetricsRequest": {},
    "GetMetricsResponse": {"prometheus_text": (1, "string")},
}

# Top-level enums and nested ones ("Outer.Inner"): value name -> number.
ENUMS: dict[str, dict[str, int]] = {
    "ProofKind": {
        "PROOF_KIND_UNSPECIFIED": 0,
        "POREP_SEAL_COMMIT": 1,
        "SNAP_DEALS_UPDATE": 2,
        "WINDOW_POST_PARTITION": 3,
        "WINNING_POST": 4,
    },
    "Priority": {
        "PRIORITY_UNSPECIFIED": 0,
        "LOW": 1,
        "NORMAL": 2,
        "HIGH": 3,
        "CRITICAL": 4,
    },
    "AwaitProofResponse.Status": {
        "UNKNOWN": 0,
        "COMPLETED": 1,
        "FAILED": 2,
        "CANCELLED": 3,
        "TIMEOUT": 4,
    },
    "SRSStatus.Tier": {"HOT": 0, "WARM": 1, "COLD": 2},
}

# RPC -> (request, response); all unary.
RPCS: dict[str, tuple[str, str]] = {
    "SubmitProof": ("SubmitProofRequest", "SubmitProofResponse"),
    "AwaitProof": ("AwaitProofRequest", "AwaitProofResponse"),
    "Prove": ("ProveRequest", "ProveResponse"),
    "CancelProof": ("CancelProofRequest", "CancelProofResponse"),
    "GetStatus": ("GetStatusRequest", "GetStatusResponse"),
    "GetMetrics": ("GetMetricsRequest", "GetMetricsResponse"),
    "PreloadSRS": ("PreloadSrsRequest", "PreloadSrsResponse"),
    "EvictSRS": ("EvictSrsRequest", "EvictSrsResponse"),
}

_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_SINT32: "sint32",
    FieldDescriptor.TYPE_SINT64: "sint64",
    FieldDescriptor.TYPE_FIXED32: "fixed32",
    FieldDescriptor.TYPE_FIXED64: "fixed64",
    FieldDescriptor.TYPE_SFIXED32: "sfixed32",
    FieldDescriptor.TYPE_SFIXED64: "sfixed64",
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_DOUBLE: "double",
}


def _local(full_name: str) -> str:
    assert full_name.startswith(PACKAGE + "."), full_name
    return full_name.removeprefix(PACKAGE + ".")


def _type_of(field: FieldDescriptor) -> str:
    if field.type == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None, field.full_name
        name = _local(field.enum_type.full_name)
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        assert field.message_type is not None, field.full_name
        name = _local(field.message_type.full_name)
    else:
        name = _SCALARS[field.type]
    return f"repeated {name}" if field.is_repeated else name


def _actual_messages() -> dict[str, dict[str, tuple[int, str]]]:
    return {
        name: {f.name: (f.number, _type_of(f)) for f in message.fields}
        for name, message in proving_pb2.DESCRIPTOR.message_types_by_name.items()
    }


def _actual_enums() -> dict[str, dict[str, int]]:
    found = {
        name: {v.name: v.number for v in enum.values}
        for name, enum in proving_pb2.DESCRIPTOR.enum_types_by_name.items()
    }
    for message in proving_pb2.DESCRIPTOR.message_types_by_name.values():
        for enum in message.enum_types:
            found[_local(enum.full_name)] = {v.name: v.number for v in enum.values}
    return found


def _diff(kind: str, expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    problems = [f"{kind} {n} is missing" for n in expected.keys() - actual.keys()]
    problems += [f"{kind} {n} is not in docs/daemon.md" for n in actual.keys() - expected.keys()]
    for name in sorted(expected.keys() & actual.keys()):
        if expected[name] != actual[name]:
            want, got = expected[name], actual[name]
            detail: object
            if isinstance(want, dict):
                keys = sorted(want.keys() | got.keys())
                detail = {k: (want.get(k), got.get(k)) for k in keys if want.get(k) != got.get(k)}
            else:
                detail = (want, got)
            problems.append(f"{kind} {name} differs (expected, actual): {detail}")
    return sorted(problems)


# --- the contract ------------------------------------------------------------------------------


def test_package_and_syntax() -> None:
    assert proving_pb2.DESCRIPTOR.package == PACKAGE
    proto = descriptor_pb2.FileDescriptorProto.FromString(proving_pb2.DESCRIPTOR.serialized_pb)
    assert proto.syntax == "proto3"
    assert list(proto.dependency) == []  # no well-known types: the real daemon uses none


def test_messages_match_the_reference() -> None:
    problems = _diff("message", MESSAGES, _actual_messages())
    assert not problems, "\n".join(problems)


def test_no_oneofs_optionals_or_nested_messages() -> None:
    # proto3 "optional" and oneofs change presence semantics on the wire; the daemon has neither.
    for message in proving_pb2.DESCRIPTOR.message_types_by_name.values():
        assert list(message.oneofs) == [], message.full_name
        assert list(message.nested_types) == [], message.full_name


def test_enums_match_the_reference() -> None:
    problems = _diff("enum", ENUMS, _actual_enums())
    assert not problems, "\n".join(problems)


def test_service_matches_the_reference() -> None:
    assert list(proving_pb2.DESCRIPTOR.services_by_name) == [SERVICE]
    service = proving_pb2.DESCRIPTOR.services_by_name[SERVICE]
    assert service.full_name == f"{PACKAGE}.{SERVICE}"
    actual = {
        m.name: (_local(m.input_type.full_name), _local(m.output_type.full_name))
        for m in service.methods
    }
    problems = _diff("rpc", RPCS, actual)
    assert not problems, "\n".join(problems)
    for method in service.methods:
        assert not method.client_streaming, method.name
        assert not method.server_streaming, method.name


class _RecordingChannel:
    """Stands in for grpc.Channel: records what the generated stub asks it for."""

    def __init__(self) -> None:
        self.calls: dict[str, tuple[str, Any, Any]] = {}

    def _record(self, kind: str, path: str, **kwargs: Any) -> str:
        self.calls[path] = (kind, kwargs["request_serializer"], kwargs["response_deserializer"])
        return path

    def unary_unary(self, path: str, **kwargs: Any) -> str:
        return self._record("unary_unary", path, **kwargs)

    def unary_stream(self, path: str, **kwargs: Any) -> str:
        return self._record("unary_stream", path, **kwargs)

    def stream_unary(self, path: str, **kwargs: Any) -> str:
        return self._record("stream_unary", path, **kwargs)

    def stream_stream(self, path: str, **kwargs: Any) -> str:
        return self._record("stream_stream", path, **kwargs)


def test_grpc_stub_method_paths() -> None:
    channel = _RecordingChannel()
    stub = proving_pb2_grpc.ProvingEngineStub(channel)
    expected = {f"/{PACKAGE}.{SERVICE}/{rpc}": types for rpc, types in RPCS.items()}
    assert set(channel.calls) == set(expected)
    for path, (request, response) in expected.items():
        kind, serializer, deserializer = channel.calls[path]
        assert kind == "unary_unary", path
        assert serializer == getattr(proving_pb2, request).SerializeToString, path
        assert deserializer == getattr(proving_pb2, response).FromString, path
        assert getattr(stub, path.rsplit("/", 1)[1]) == path


def test_servicer_registers_every_rpc() -> None:
    class _Server:
        def __init__(self) -> None:
            self.registered: dict[str, dict[str, Any]] = {}

        def add_generic_rpc_handlers(self, handlers: Any) -> None:
            pass

        def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
            self.registered[service] = handlers

    server = _Server()
    proving_pb2_grpc.add_ProvingEngineServicer_to_server(
        proving_pb2_grpc.ProvingEngineServicer(), server
    )
    assert set(server.registered) == {f"{PACKAGE}.{SERVICE}"}
    assert set(server.registered[f"{PACKAGE}.{SERVICE}"]) == set(RPCS)


# --- the committed stubs are what `make protos` writes -------------------------------------------

# Lines that name the protoc / grpcio-tools release; they may differ between tool versions while
# the stubs are otherwise the same.
_VERSION_LINES = [
    (re.compile(r"^# Protobuf Python Version: .*$", re.M), "# Protobuf Python Version: X"),
    (re.compile(r"^GRPC_GENERATED_VERSION = .*$", re.M), "GRPC_GENERATED_VERSION = X"),
    (
        re.compile(r"(ValidateProtobufRuntimeVersion\(\s*[\w.]+,)\s*\d+,\s*\d+,\s*\d+,\s*'[^']*',"),
        r"\1 X,",
    ),
]
_SERIALIZED = re.compile(r"AddSerializedFile\((b'.*?')\)\n")


def _normalised(text: str) -> str:
    for pattern, replacement in _VERSION_LINES:
        text = pattern.sub(replacement, text)
    return text


def _file_descriptor(pb2_text: str) -> descriptor_pb2.FileDescriptorProto:
    match = _SERIALIZED.search(pb2_text)
    assert match, "no AddSerializedFile(...) in proving_pb2.py"
    return descriptor_pb2.FileDescriptorProto.FromString(ast.literal_eval(match.group(1)))


def stub_differences(committed: Path, generated: Path) -> list[str]:
    """What differs between two sets of stubs, ignoring only the tool-version lines."""
    problems = []
    want = _file_descriptor((generated / "proving_pb2.py").read_text())
    got = _file_descriptor((committed / "proving_pb2.py").read_text())
    if want.SerializeToString(deterministic=True) != got.SerializeToString(deterministic=True):
        diff = difflib.unified_diff(
            str(got).splitlines(), str(want).splitlines(), "committed", "regenerated", lineterm=""
        )
        problems.append("proving_pb2.py: descriptor differs:\n" + "\n".join(diff))
    for name in GENERATED:
        if _normalised((committed / name).read_text()) != _normalised(
            (generated / name).read_text()
        ):
            problems.append(f"{name} differs from a fresh generation")
    return problems


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stubs")
    generate(out)
    return out


def test_committed_stubs_are_up_to_date(regenerated: Path) -> None:
    problems = stub_differences(PACKAGE_DIR, regenerated)
    assert not problems, (
        "the committed stubs in cuzk_supervisor/proto are stale: "
        "run `make protos` and commit them\n" + "\n".join(problems)
    )


def test_committed_descriptor_is_the_imported_one() -> None:
    committed = _file_descriptor((PACKAGE_DIR / "proving_pb2.py").read_text())
    assert committed.SerializeToString() == proving_pb2.DESCRIPTOR.serialized_pb


def test_stub_check_ignores_only_version_lines(regenerated: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(regenerated, copy)
    pb2, grpc_py = copy / "proving_pb2.py", copy / "proving_pb2_grpc.py"
    # Another tool release: only the version lines change. Still up to date.
    text = pb2.read_text().replace("# Protobuf Python Version: ", "# Protobuf Python Version: 9")
    text = re.sub(r"(ValidateProtobufRuntimeVersion\(\s*[\w.]+,\s*)\d+", r"\g<1>99", text)
    pb2.write_text(text)
    grpc_py.write_text(
        re.sub(
            r"GRPC_GENERATED_VERSION = '[^']*'",
            "GRPC_GENERATED_VERSION = '9.9.9'",
            grpc_py.read_text(),
        )
    )
    assert stub_differences(copy, regenerated) == []

    # A renumbered field (as a stale stub would carry) is caught by the descriptor comparison.
    original = pb2.read_text()
    assert b"\\ntimeout_ms\\x18\\x02" in original.encode()
    pb2.write_text(original.replace("\\ntimeout_ms\\x18\\x02", "\\ntimeout_ms\\x18\\x03"))
    problems = stub_differences(copy, regenerated)
    assert any("descriptor differs" in p for p in problems), problems

    # Any other edit to any of the three files is caught by the text comparison.
    pb2.write_text(original)
    for name in GENERATED:
        shutil.copy(regenerated / name, copy / name)
        (copy / name).write_text((copy / name).read_text() + "\n# edited\n")
        assert stub_differences(copy, regenerated) == [f"{name} differs from a fresh generation"]
        shutil.copy(regenerated / name, copy / name)
