"""CPU cost of one ``MemorySampler.sample`` on this machine (``time.process_time`` per call).

    .venv/bin/python bench/sampler_cost.py [--samples 2000]

Prints a JSON line, then a table. Two cases: no daemon (host + cgroup + PSI files only) and a
daemon tree of four processes (adds the psutil tree walk, which reads every ``/proc/*/stat``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

from cuzk_supervisor.adapters.machine.resources import MemorySampler

# A root that starts three children; all wait on stdin so the tree is stable while we measure.
_TREE = (
    "import subprocess, sys\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'],"
    " stdin=subprocess.PIPE) for _ in range(3)]\n"
    "print('up', flush=True)\n"
    "sys.stdin.read()\n"
    "for k in kids: k.stdin.close(); k.wait()\n"
)


def measure(sampler: MemorySampler, pid: int | None, n: int) -> dict[str, float]:
    for _ in range(50):  # warm the page cache and psutil's lazy imports
        sampler.sample(pid)
    costs = []
    for _ in range(n):
        t0 = time.process_time()
        sampler.sample(pid)
        costs.append(time.process_time() - t0)
    costs.sort()
    return {
        "mean_us": statistics.fmean(costs) * 1e6,
        "p50_us": costs[len(costs) // 2] * 1e6,
        "p95_us": costs[int(len(costs) * 0.95) - 1] * 1e6,
        "max_us": costs[-1] * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()

    sampler = MemorySampler()
    tree = subprocess.Popen(
        [sys.executable, "-c", _TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert tree.stdout is not None
        assert tree.stdout.readline().strip() == "up"
        results = {
            "no_daemon": measure(sampler, None, args.samples),
            "daemon_tree_4": measure(sampler, tree.pid, args.samples),
        }
        processes = sampler.sample(tree.pid).daemon_processes
    finally:
        assert tree.stdin is not None
        tree.stdin.close()
        tree.wait(timeout=10)

    cg = sampler.cgroup
    report = {
        "samples": args.samples,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "cgroup": None if cg is None else {"version": cg.version, "dir": str(cg.dir)},
        "daemon_tree_processes": processes,
        "cpu_per_sample": results,
    }
    print(json.dumps(report))
    print()
    print(f"{'case':<16}{'mean µs':>10}{'p50 µs':>10}{'p95 µs':>10}{'max µs':>10}")
    for case, r in results.items():
        print(
            f"{case:<16}{r['mean_us']:>10.1f}{r['p50_us']:>10.1f}{r['p95_us']:>10.1f}"
            f"{r['max_us']:>10.1f}"
        )


if __name__ == "__main__":
    main()
