"""``cuzk-supervisor plan``: a plan and its reasons on a machine without GPUs or NVML."""

import json
import subprocess
import sys


def plan(*args, env_extra=None):
    env = {"PATH": "/usr/bin:/bin", **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "cuzk_supervisor", "plan", *args],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip


def test_what_if_host_with_two_gpus_shows_in_the_plan():
    out = plan("--host-gib", "384", "--gpus", "2", "--vram-gib", "24", "--json")
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    assert document["full_workers"] == 10
    assert document["inputs"]["gpu_vram_total_bytes"] == [24 * 2**30] * 2


def test_no_nvml_means_one_warning_and_a_plan_from_ram():
    out = plan("--host-gib", "256")
    assert out.returncode == 0, out.stderr
    assert "full_workers" in out.stdout
    assert out.stderr.count("NVML unavailable") == 1


def test_a_machine_too_small_is_refused_with_the_shortfall():
    out = plan("--host-gib", "2048", "--cgroup-gib", "64", "--gpu-probe", "none")
    assert out.returncode == 5
    assert "short by" in out.stdout
    assert "cgroup 64 GiB" in out.stdout


def test_plan_memory_scale_is_applied():
    """plan lists --plan-memory-scale; it plans with it, as run and doctor do."""
    out = plan("--host-gib", "0.5", "--gpu-probe", "none", "--plan-memory-scale", "1024", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    document = json.loads(out.stdout)
    assert document["inputs"]["memory_scale"] == 1024
    assert document["full_workers"] == 12  # a 512 GiB host, once scaled
