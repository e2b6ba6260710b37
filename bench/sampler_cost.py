"""CPU cost of one ``MemorySampler.sample`` on this machine (``time.process_time`` per call).

    .venv/bin/python bench/sampler_cost.py [--samples 2000] [--quick] [--json FILE]

Two cases: no daemon (host + cgroup + PSI files only) and a daemon tree of four processes (adds
the psutil tree walk, which reads every ``/proc/*/stat``). Prints a JSON line of the rows
(``{"name", "value", "unit", "target", "ok"}``), then a table and what was measured on;
``--json FILE`` writes the rows. ``--quick``: 200 samples a case. Exit 0 when every row holds a
figure and meets its target, 1 when one is NOT MEASURED, 3 when a target is missed (a quick run
holds only the targets of what must never happen: ``_harness.held``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

from _harness import Row, finish, info, print_table, standard_options

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    standard_options(parser, "200 samples a case")
    args = parser.parse_args()
    samples = 200 if args.quick else args.samples

    sampler = MemorySampler()
    tree = subprocess.Popen(
        [sys.executable, "-c", _TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert tree.stdout is not None
        assert tree.stdout.readline().strip() == "up"
        results = {
            "no_daemon": measure(sampler, None, samples),
            "daemon_tree_4": measure(sampler, tree.pid, samples),
        }
        processes = sampler.sample(tree.pid).daemon_processes
    finally:
        assert tree.stdin is not None
        tree.stdin.close()
        tree.wait(timeout=10)

    rows: list[Row] = [
        info(f"CPU per sample, {case}: {stat.removesuffix('_us')}", value, "µs")
        for case, figures in results.items()
        for stat, value in figures.items()
    ]
    print(json.dumps([r.as_dict() for r in rows]))
    print()
    print_table(rows)
    cg = sampler.cgroup
    print()
    print(
        f"- {samples} samples a case; python {platform.python_version()}, kernel "
        f"{platform.release()}; cgroup "
        + ("none" if cg is None else f"v{cg.version} at {cg.dir}")
        + f"; daemon tree: {processes} processes"
    )
    return finish(rows, args.json)


if __name__ == "__main__":
    sys.exit(main())
