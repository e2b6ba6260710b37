"""core.boundproject: each projection's arithmetic, its limits and the assumptions it states
(the projections are checked against the simulator by bench/projections.py)."""

from __future__ import annotations

import pytest

from cuzk_supervisor.core import contention
from cuzk_supervisor.core.boundevidence import Evidence, Shape
from cuzk_supervisor.core.boundproject import Projection, project


def evidence(**figures: object) -> Evidence:
    base: dict[str, object] = {
        "samples": 40, "span_s": 60.0, "gpu_workers": 2, "gpus": 1, "partition_workers": 2,
        "synthesis_load": 1.0, "gpu_busy_share": 0.3, "gpu_both_share": 0.05,
        "synth_s": 30.4, "gpu_s": 4.0, "partitions_per_proof": 10.0, "cpu_busy_share": 0.2,
    }  # fmt: skip
    base.update(figures)
    return Evidence(**base)  # type: ignore[arg-type]


def named(projections: tuple[Projection, ...]) -> dict[str, Projection]:
    return {p.name: p for p in projections}


def test_more_workers_scale_synthesis_by_the_measured_contention() -> None:
    p = named(project(evidence(), Shape(2, 2), 23.7))
    assert p["as-run"].rate_per_hour == 23.7
    more = p["more-workers"]
    assert (more.workers, more.limit) == (4, "synthesis")
    assert more.rate_per_hour == pytest.approx(23.7 * contention.gain(2, 4))
    assert any("upstream's measured contention" in a for a in more.assumptions)
    # A synthesis-bound machine: neither another GPU nor another proof in flight helps.
    assert p["one-more-gpu"].rate_per_hour == pytest.approx(23.7)
    assert p["one-more-in-flight"].rate_per_hour == pytest.approx(23.7)


def test_more_workers_go_only_as_far_as_the_memory_allows() -> None:
    more = named(project(evidence(), Shape(2, 2, max_workers=3), 23.7))["more-workers"]
    assert more.workers == 3
    assert "the memory allows 3 partition workers" in more.assumptions
    none = named(project(evidence(), Shape(2, 2, max_workers=2), 23.7))["more-workers"]
    assert (none.workers, none.rate_per_hour) == (2, pytest.approx(23.7))


def test_a_full_cpu_gains_nothing_from_more_workers() -> None:
    more = named(project(evidence(cpu_busy_share=0.95), Shape(2, 2), 23.7))["more-workers"]
    assert more.rate_per_hour == pytest.approx(23.7)
    assert "the CPU was busy 95 %: more workers share the same cores" in more.assumptions


def test_past_the_table_its_plateau_is_assumed_and_said() -> None:
    e = evidence(partition_workers=10, synth_s=42.5, gpu_busy_share=0.7)
    more = named(project(e, Shape(10, 2), 84.7))["more-workers"]
    assert more.workers == 20
    assert more.rate_per_hour == pytest.approx(84.7)
    assert any("past 12 workers the table has no row" in a for a in more.assumptions)


def test_one_more_gpu_scales_a_gpu_bound_rate() -> None:
    e = evidence(partition_workers=5, synthesis_load=0.3, gpu_busy_share=1.0,
                 gpu_both_share=1.0, gpu_utilisation=1.0)  # fmt: skip
    p = named(project(e, Shape(5, 2), 15.0))
    assert p["as-run"].limit == "gpu"
    gpu = p["one-more-gpu"]
    assert (gpu.gpus, gpu.gpu_workers, gpu.rate_per_hour) == (2, 4, pytest.approx(30.0))
    assert "GPU capacity from NVML's utilisation" in gpu.assumptions
    assert p["more-workers"].rate_per_hour == pytest.approx(15.0)


def test_a_gpu_nvml_calls_idle_is_scaled_by_its_workers_time_instead() -> None:
    e = evidence(partition_workers=10, synth_s=42.5, synthesis_load=0.5, gpu_busy_share=1.0,
                 gpu_both_share=1.0, gpu_utilisation=0.33)  # fmt: skip
    gpu = named(project(e, Shape(10, 2), 40.0))["one-more-gpu"]
    assert gpu.rate_per_hour == pytest.approx(80.0)
    assert any("the CPU work around it fills the stage" in a for a in gpu.assumptions)


def test_a_feed_bound_rate_rises_with_one_more_in_flight() -> None:
    # One proof at a time on 10 workers: synthesizing 58 % of the time, the GPU 42 %.
    e = evidence(partition_workers=10, synthesis_load=0.58, gpu_busy_share=0.42,
                 gpu_both_share=0.4, synth_s=42.5)  # fmt: skip
    p = named(project(e, Shape(10, 1), 48.0))
    assert p["as-run"].limit == "feed"
    more = p["one-more-in-flight"]
    assert more.concurrency == 2
    assert more.rate_per_hour == pytest.approx(48.0 / 0.58)  # synthesis binds then
    assert more.limit == "synthesis"


def test_no_rate_no_projection() -> None:
    assert project(evidence(), Shape(2, 2), None) == ()
    assert project(evidence(), Shape(2, 2), 0.0) == ()
