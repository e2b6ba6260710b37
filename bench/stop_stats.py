"""The adaptive stop's claims, checked over many seeded runs (issue 32, item 5).

    .venv/bin/python bench/stop_stats.py [--runs N] [--scenario NAME ...] [--json FILE] [--quick]

Each scenario runs ``--runs`` (200) seeded stretches of a pure model of the pipeline
(``bench/_stopmodel.py``: partition slots first come first served, GPU workers, seeded noise per
partition, a drift, a client that hears some completions late) driven by the product's own core
decisions (``core.bench.next_submission`` at every completion heard, ``core.benchreport.
choose_measurement`` at the end), in process and in virtual time: seconds for all of them. The
settings are the product's defaults: a batch of 12 at concurrency 2, ``bench_precision`` 1 %,
``bench_max_proofs`` 36, ``bench_min_soak_s`` 600, the bench's share of the manager's budget
(2100 s: its 45 min less the warmup, restart and settle). Each seed also runs as the fixed
batch (``bench_precision`` 0), for the time saved.

The scenarios: a quiet machine (2 workers, 1 % noise a partition); 5 % noise a partition (5
workers: a pipeline started from idle runs 0.3-0.8 % slow for its first few dozen proofs there,
while its partitions fall out of step, which no interval from the stretch itself can see: the
trend allowance covers it); a lumpy 12-worker pipeline; synthesis 10 % slower from proof 7;
1 % slower every proof; the minimum rate 3 % under and over the steady one; half the completions
heard up to 1.5 intervals late (a connection reset again and again, a starved supervisor).
The same late hearing on 12 workers at concurrency 2 is printed without targets: that pipeline
has no slack (12 workers > the 10 partitions of the one other proof in flight), so every late
resubmission idles it and changes its lumps for good; the machine then delivers less than its
steady rate and nothing in the stretch tells by how much. In the field a late hearing costs
milliseconds against 40 s intervals; in a simulation scaled 100 times it does not.

Per scenario it prints:

- **covered**: runs whose stated 95 % interval (``uncertainty_pct``) holds the truth: the
  machine's steady rate, or where it drifts the rate it holds at the end (its long-run rate at
  the last proof's slowdown). Target >= 95 %.
- **within 1 %** of that truth, and **stopped early wrongly**: runs that ended before the
  batch on a rate more than the precision off the truth (target <= 1 %).
- drift scenarios, **honest**: runs within 1 % of the rate held at the end, or that did not stop
  early and say they drifted (the record's ``drifted``), target >= 95 %;
- near ``MIN_RATE``, **wrong verdicts**: runs whose reported rate is on the other side of the
  minimum than the truth (target <= 1 %);
- the **time saved** against the fixed batch of the same seed (median, from the stretch's start
  to its last completion: its verdict; the quiet scenario's target >= 25 %) and the proofs used.

``--quick``: 30 runs per scenario (every row still; the targets are for the full count).
Exit 0 when every row holds a figure and meets its target, 1 when one is NOT MEASURED, 3 when a
target is missed (a quick run holds only the targets of what must never happen: ``_harness.held``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from _harness import Row, at_least, at_most, info, progress_printer, report, standard_options
from _stopmodel import Machine, Outcome, run, steady_rate_per_hour

from cuzk_supervisor.core.bench import BenchPolicy

RUNS = 200
QUICK_RUNS = 30
BUDGET_S = 2100.0
SOAK_S = 600.0
PRECISION = 0.01
COVERED_TARGET = 95.0
SOONER_TARGET = 25.0
WRONG_VERDICTS_MOST = 1.0
EARLY_WRONG_MOST = 1.0

progress = progress_printer("stats")


def step_from_seventh(seq: int) -> float:
    return 1.10 if seq >= 6 else 1.0


def one_percent_a_proof(seq: int) -> float:
    return 1.01**seq


@dataclass(frozen=True)
class Scenario:
    name: str
    machine: Machine
    drift: bool = False
    min_rate_factor: float = 0.0
    """The minimum rate as a share of the steady rate (0: a local run, no verdict)."""
    sooner_target: bool = False
    targets: bool = True
    """False: figures only (a case the bench shows, not a claim; see the module's text)."""


def scenarios() -> list[Scenario]:
    return [
        Scenario("quiet (2 workers, 1 % noise)", Machine(2, 152.0, 0.01), sooner_target=True),
        Scenario("5 % noise per partition (5 workers)", Machine(5, 68.4, 0.05)),
        Scenario("lumpy 12-worker pipeline (1 % noise)", Machine(12, 42.5, 0.01)),
        Scenario("drift 10 % from proof 7 (5 workers)", Machine(5, 68.4, 0.01, step_from_seventh),
                 drift=True),
        Scenario("gradual 1 % per proof (5 workers)", Machine(5, 68.4, 0.01, one_percent_a_proof),
                 drift=True),
        Scenario("near MIN_RATE, 3 % above (2 workers, 2 % noise)", Machine(2, 152.0, 0.02),
                 min_rate_factor=0.97),
        Scenario("near MIN_RATE, 3 % below (2 workers, 2 % noise)", Machine(2, 152.0, 0.02),
                 min_rate_factor=1.03),
        Scenario("half the completions heard up to 1.5 intervals late (2 workers)",
                 Machine(2, 152.0, 0.01, late_share=0.5, late_most=1.5)),
        Scenario("half the completions heard up to 1.5 intervals late (12 workers, no slack)",
                 Machine(12, 42.5, 0.01, late_share=0.5, late_most=1.5), targets=False),
    ]  # fmt: skip


def policy(precision: float, min_rate: float) -> BenchPolicy:
    return BenchPolicy(max_proofs=12, concurrency=2, safety=1.25, min_proofs=3,
                       precision=precision, most_proofs=36, min_rate=min_rate,
                       min_soak_s=SOAK_S)  # fmt: skip


@dataclass
class Tally:
    runs: int = 0
    covered: int = 0
    within: int = 0
    early_wrong: int = 0
    honest: int = 0
    wrong_verdicts: int = 0
    saved: list[float] = field(default_factory=list)
    proofs: list[int] = field(default_factory=list)
    fixed_proofs: list[int] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)
    stops: dict[str, int] = field(default_factory=dict)

    def pct(self, count: int) -> float:
        return round(100.0 * count / self.runs, 1) if self.runs else 0.0


def judge(s: Scenario, adaptive: Outcome, fixed: Outcome, truth: Callable[[int], float],
          steady: float, tally: Tally) -> None:  # fmt: skip
    m = adaptive.measurement
    target = truth(adaptive.last_seq)
    error = m.rate_per_hour / target - 1
    tally.runs += 1
    tally.errors.append(error)
    tally.covered += m.uncertainty is not None and abs(error) <= m.uncertainty
    tally.within += abs(error) <= PRECISION
    early = m.stopped == "precision"
    tally.early_wrong += early and abs(error) > PRECISION
    tally.honest += abs(error) <= PRECISION or (not early and m.drifted)
    if s.min_rate_factor:
        minimum = steady * s.min_rate_factor
        tally.wrong_verdicts += (m.rate_per_hour >= minimum) != (target >= minimum)
    tally.saved.append(1 - adaptive.seconds / fixed.seconds)
    tally.proofs.append(adaptive.stretch.submitted)
    tally.fixed_proofs.append(fixed.stretch.submitted)
    tally.stops[m.stopped] = tally.stops.get(m.stopped, 0) + 1


def measure(s: Scenario, runs: int) -> Tally:
    steady = steady_rate_per_hour(s.machine)
    ends: dict[float, float] = {}

    def truth(last_seq: int) -> float:
        factor = s.machine.slowdown(last_seq) if s.drift else 1.0
        if factor not in ends:
            ends[factor] = steady_rate_per_hour(s.machine, factor)
        return ends[factor]

    min_rate = steady * s.min_rate_factor
    tally = Tally()
    for seed in range(runs):
        adaptive = run(s.machine, policy(PRECISION, min_rate), seed, BUDGET_S)
        fixed = run(s.machine, policy(0.0, min_rate), seed, BUDGET_S)
        judge(s, adaptive, fixed, truth, steady, tally)
    return tally


def rows_for(s: Scenario, t: Tally) -> list[Row]:
    name = s.name

    def held(label: str, value: float, unit: str, target: Callable[..., Row], limit: float) -> Row:
        return (
            target(f"{name}: {label}", value, unit, limit)
            if s.targets
            else info(f"{name}: {label}", value, unit)
        )

    rows = [
        held("interval covers the truth", t.pct(t.covered), "% runs", at_least, COVERED_TARGET),
        info(f"{name}: within 1 % of the truth", t.pct(t.within), "% runs"),
        held("stopped early wrongly", t.pct(t.early_wrong), "% runs", at_most, EARLY_WRONG_MOST),
    ]
    if s.drift:
        rows.append(held("within 1 % of the end, or no early stop and says drifted",
                         t.pct(t.honest), "% runs", at_least, COVERED_TARGET))  # fmt: skip
    if s.min_rate_factor:
        rows.append(held("wrong verdicts", t.pct(t.wrong_verdicts), "% runs", at_most,
                         WRONG_VERDICTS_MOST))  # fmt: skip
    saved = round(100 * statistics.median(t.saved), 1)
    if s.sooner_target:
        rows.append(at_least(f"{name}: time saved vs the fixed batch", saved, "%", SOONER_TARGET))
    else:
        rows.append(info(f"{name}: time saved vs the fixed batch", saved, "%"))
    rows.append(info(f"{name}: proofs used (median)", statistics.median(t.proofs), "proofs"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=None, help=f"per scenario (default {RUNS})")
    parser.add_argument("--scenario", nargs="*", default=None, help="names containing this")
    standard_options(parser, f"{QUICK_RUNS} runs per scenario")
    args = parser.parse_args(argv)
    runs = args.runs or (QUICK_RUNS if args.quick else RUNS)
    chosen = [
        s for s in scenarios() if not args.scenario or any(w in s.name for w in args.scenario)
    ]
    rows: list[Row] = []
    notes = [
        f"{runs} seeded runs per scenario; batch 12 at concurrency 2, precision ±{PRECISION:.0%}, "
        f"at most 36 proofs, soak {SOAK_S:g} s, budget {BUDGET_S:g} s (model seconds)"
    ]
    for s in chosen:
        progress(f"{s.name}: {runs} runs")
        t = measure(s, runs)
        rows += rows_for(s, t)
        errors = sorted(abs(e) for e in t.errors)
        stops = ", ".join(f"{k or '-'} {v}" for k, v in sorted(t.stops.items()))
        notes.append(
            f"{s.name}: |error| median {100 * statistics.median(errors):.2f} %, worst "
            f"{100 * errors[-1]:.2f} %; proofs {min(t.proofs)}-{max(t.proofs)} (fixed "
            f"{statistics.median(t.fixed_proofs):g}); stopped: {stops}"
        )
    return report(rows, notes, args.json, args.quick)


if __name__ == "__main__":
    sys.exit(main())
