"""Config parsing as the real daemon does it, quirks included."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuzk_supervisor.sim.daemon.config import (
    DEFAULT_LISTEN,
    GIB,
    MIB,
    ConfigError,
    load_config,
    parse_config,
    parse_size,
)

MEMTOTAL = 128 * GIB


@pytest.fixture
def meminfo(tmp_path: Path) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {MEMTOTAL // 1024} kB\nMemFree:  1 kB\n")
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("256GiB", 256 * GIB),
        ("512 MiB", 512 * MIB),
        ("100GB", 100 * 10**9),
        ("20MB", 20 * 10**6),
        ("1048576", 1048576),
        (4096, 4096),
        ("1.5GiB", int(1.5 * GIB)),
    ],
)
def test_sizes_parse_only_with_known_suffixes(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["256G", "256gib", "1TiB", "lots", "", "-5", "12 KiB"])
def test_anything_else_is_not_a_size(text: str) -> None:
    assert parse_size(text) is None


def test_unparsable_total_budget_silently_becomes_50_gib() -> None:
    cfg = parse_config({"memory": {"total_budget": "256G"}}, MEMTOTAL)
    assert cfg.total_budget_bytes == 50 * GIB


def test_auto_budget_is_memtotal_minus_safety_margin() -> None:
    assert parse_config({}, MEMTOTAL).total_budget_bytes == MEMTOTAL - 5 * GIB
    cfg = parse_config({"memory": {"safety_margin": "10GiB"}}, MEMTOTAL)
    assert cfg.total_budget_bytes == MEMTOTAL - 10 * GIB


def test_missing_file_means_all_defaults(tmp_path: Path, meminfo: Path) -> None:
    cfg = load_config(tmp_path / "nope.toml", meminfo)
    assert not cfg.found
    assert cfg.partition_workers == 20
    assert cfg.max_parallel_synthesis == 18
    assert cfg.gpu_workers_per_device == 2
    assert cfg.param_cache == Path("/data/zk/params")
    assert cfg.listen == DEFAULT_LISTEN
    assert cfg.status_listen is None
    assert cfg.preload == ()
    assert cfg.log_level == "info"
    assert cfg.total_budget_bytes == MEMTOTAL - 5 * GIB


def test_file_values_and_unknown_keys_ignored(tmp_path: Path, meminfo: Path) -> None:
    path = tmp_path / "cuzk.toml"
    path.write_text(
        """
[synthesis]
partition_workers = 7
threads = 0
[memory]
total_budget = "256GiB"
[pipeline]
max_parallel_synthesis = 9
brand_new_knob = true
[srs]
param_cache = "/var/params"
preload = ["porep-32g"]
[daemon]
listen = "127.0.0.1:9000"
status_listen = "127.0.0.1:9821"
[gpus]
gpu_workers_per_device = 3
[logging]
level = "debug"
[no_such_section]
x = 1
"""
    )
    cfg = load_config(path, meminfo)
    assert cfg.found
    assert cfg.partition_workers == 7
    assert cfg.total_budget_bytes == 256 * GIB
    assert cfg.max_parallel_synthesis == 9
    assert cfg.param_cache == Path("/var/params")
    assert cfg.preload == ("porep-32g",)
    assert cfg.listen == "127.0.0.1:9000"
    assert cfg.status_listen == "127.0.0.1:9821"
    assert cfg.gpu_workers_per_device == 3
    assert cfg.log_level == "debug"


def test_wrong_type_and_bad_toml_are_errors(tmp_path: Path, meminfo: Path) -> None:
    with pytest.raises(ConfigError, match="partition_workers"):
        parse_config({"synthesis": {"partition_workers": "ten"}}, MEMTOTAL)
    path = tmp_path / "bad.toml"
    path.write_text("[synthesis\npartition_workers = 2\n")
    with pytest.raises(ConfigError, match="failed to parse"):
        load_config(path, meminfo)
