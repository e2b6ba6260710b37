"""SupervisorMetrics: every metric present, each typed update visible in the exposition."""

from __future__ import annotations

import math

import prometheus_client
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from cuzk_supervisor.adapters.machine.gpu import GpuDevice
from cuzk_supervisor.core.bound import Bound, Evidence, Projection, Verdict
from cuzk_supervisor.core.exits import ExitKind
from cuzk_supervisor.core.risk import RiskLevel
from cuzk_supervisor.serve.exposition import Counter, Family, Histogram, HistogramChild, go_float
from cuzk_supervisor.serve.metrics import CONTENT_TYPE, PHASES, PROOF_BUCKETS, SupervisorMetrics

GIB = 1 << 30

FAMILIES = {
    "cuzk_supervisor_up": "gauge",
    "cuzk_supervisor_start_time_seconds": "gauge",
    "cuzk_supervisor_phase": "gauge",
    "cuzk_supervisor_daemon_exits": "counter",
    "cuzk_supervisor_proofs_completed": "counter",
    "cuzk_supervisor_proofs_failed": "counter",
    "cuzk_supervisor_proof_duration_seconds": "histogram",
    "cuzk_supervisor_bench_rate_proofs_per_hour": "gauge",
    "cuzk_supervisor_bench_rate_uncertainty_ratio": "gauge",
    "cuzk_supervisor_bench_bound": "gauge",
    "cuzk_supervisor_bench_gpu_busy_share": "gauge",
    "cuzk_supervisor_bench_synthesis_limiter_use": "gauge",
    "cuzk_supervisor_bench_projected_rate_proofs_per_hour": "gauge",
    "cuzk_supervisor_memory_headroom_bytes": "gauge",
    "cuzk_supervisor_oom_risk_level": "gauge",
    "cuzk_supervisor_gpu_memory_used_bytes": "gauge",
    "cuzk_supervisor_gpu_memory_capacity_bytes": "gauge",
    "cuzk_supervisor_grpc_reconnects": "counter",
    "cuzk_supervisor_manager_outbox_depth": "gauge",
    "cuzk_supervisor_manager_failed_requests": "counter",
    "cuzk_supervisor_manager_weather": "gauge",
    "cuzk_supervisor_health_connections_dropped": "counter",
    "cuzk_supervisor_health_level": "gauge",
    "cuzk_supervisor_health_finding": "gauge",
    "cuzk_supervisor_health_actions": "counter",
}


def parse(metrics: SupervisorMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the exposition, keyed by (sample name, labels)."""
    text = metrics.render().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict, sample: str, /, **labels: str) -> float:
    return samples[(sample, frozenset(labels.items()))]


def device(index: int, name: str, used_gib: float, total_gib: float) -> GpuDevice:
    used, total = int(used_gib * GIB), int(total_gib * GIB)
    return GpuDevice(index, name, f"GPU-{index}", total, used, total - used)


def test_every_metric_is_present_with_its_type_from_the_start():
    text = SupervisorMetrics().render().decode()
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    for name, kind in FAMILIES.items():
        assert families.get(name) == kind, name


def test_the_old_misleading_names_are_gone():
    """daemon_restarts_total counted exits (a clean exit is no restart); gpu_memory_total_bytes
    was a gauge with a counter's suffix."""
    metrics = SupervisorMetrics()
    metrics.daemon_exit(ExitKind.CLEAN)
    metrics.gpus([device(0, "NVIDIA H200", 12, 141)])
    text = metrics.render().decode()
    assert "cuzk_supervisor_daemon_exits_total" in text
    assert "cuzk_supervisor_gpu_memory_capacity_bytes" in text
    assert "daemon_restarts" not in text
    assert "gpu_memory_total" not in text


def every_kind_of_update(metrics: SupervisorMetrics) -> None:
    metrics.daemon_exit(ExitKind.CRASHED)
    metrics.proof_finished(True, 2.0)
    metrics.proof_finished(False, 1.0)
    metrics.grpc_reconnect()
    metrics.health_connection_dropped("disconnect")
    metrics.gpus([device(0, "NVIDIA H200", 12, 141)])


def test_no_created_series_for_any_counter_or_histogram():
    metrics = SupervisorMetrics()
    every_kind_of_update(metrics)
    text = metrics.render().decode()
    assert "_created" not in text
    families = list(text_string_to_metric_families(text))
    assert {f.type for f in families} >= {"counter", "histogram", "gauge"}
    assert not [s.name for f in families for s in f.samples if s.name.endswith("_created")]


class _Mirror:
    """Our series as prometheus_client's own metric families (a collector), so that its
    ``generate_latest`` writes them: the text ``/metrics`` was made with before issue 35."""

    def __init__(self, families: list[Family]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        out: list[Metric] = []
        for family in self.families:
            names = list(family.labelnames)
            if isinstance(family, Histogram):
                child = family._children[()]
                assert isinstance(child, HistogramChild)
                cumulative, running = [], 0.0
                for bound, count in zip(child.bounds, child.counts, strict=True):
                    running += count
                    cumulative.append((floatToGoString(bound), running))
                histogram = HistogramMetricFamily(family.name, family.documentation, labels=[])
                histogram.add_metric([], cumulative, child.value)
                out.append(histogram)
                continue
            kind = CounterMetricFamily if isinstance(family, Counter) else GaugeMetricFamily
            mirror = kind(family.name, family.documentation, labels=names)
            for key, series in family._children.items():
                mirror.add_metric(list(key), series.value)
            out.append(mirror)
        return out


def test_the_exposition_is_what_prometheus_client_writes_for_the_same_series():
    """Byte for byte, escapes and float forms included: /metrics did not change when the
    library was replaced by serve.exposition (issue 35)."""
    metrics = SupervisorMetrics(clock=lambda: 1_700_000_000.5)
    every_kind_of_update(metrics)
    metrics.daemon_exit('odd "kind" \\ with\na newline')
    metrics.gpus([device(0, 'GPU "zero" \\', 12, 141), device(1, "NVIDIA H200", 30, 141)])
    for seconds in (0.05, 0.3, 1500.0, 1e9):
        metrics.proof_finished(True, seconds)
    metrics.memory(123_456_789_012, RiskLevel.WARN)
    metrics.bench_bound(_verdict(Bound.GPU, 0.97, 1 / 3))
    metrics.health(1, ["gpu_lost", "a-new-kind"])
    assert metrics.render() == prometheus_client.generate_latest(_Mirror(metrics.registry))
    metrics.gpus([])
    metrics.bench_bound(None)
    assert metrics.render() == prometheus_client.generate_latest(_Mirror(metrics.registry))


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_floats_are_written_as_prometheus_client_writes_them(x: float):
    assert go_float(x) == floatToGoString(x)


def test_up_and_start_time():
    samples = parse(SupervisorMetrics(clock=lambda: 1_700_000_000.0))
    assert value(samples, "cuzk_supervisor_up") == 1
    assert value(samples, "cuzk_supervisor_start_time_seconds") == 1_700_000_000.0


def test_phase_is_one_for_the_current_phase_and_zero_for_every_other():
    metrics = SupervisorMetrics()
    samples = parse(metrics)
    assert {p for p in PHASES if value(samples, "cuzk_supervisor_phase", phase=p) == 1} == {"start"}
    metrics.set_phase("warmup")
    metrics.set_phase("bench")
    samples = parse(metrics)
    assert {p for p in PHASES if value(samples, "cuzk_supervisor_phase", phase=p) == 1} == {"bench"}
    assert metrics.phase == "bench"


def test_an_unknown_phase_gets_its_own_series():
    metrics = SupervisorMetrics(phase="run")
    metrics.set_phase("draining")
    samples = parse(metrics)
    assert value(samples, "cuzk_supervisor_phase", phase="draining") == 1
    assert value(samples, "cuzk_supervisor_phase", phase="run") == 0


def test_daemon_exits_count_by_kind_with_every_kind_present():
    metrics = SupervisorMetrics()
    metrics.daemon_exit(ExitKind.OOM_KILLED)
    metrics.daemon_exit(ExitKind.OOM_KILLED)
    metrics.daemon_exit("crashed")
    samples = parse(metrics)
    counts = {
        kind.value: value(samples, "cuzk_supervisor_daemon_exits_total", kind=kind.value)
        for kind in ExitKind
    }
    assert counts == {
        "clean": 0,
        "crashed": 1,
        "killed": 0,
        "oom_killed": 2,
        "failed_to_start": 0,
    }


def test_proofs_count_and_only_completed_ones_are_timed():
    metrics = SupervisorMetrics()
    metrics.proof_finished(True, 0.2)
    metrics.proof_finished(True, 1500.0)
    metrics.proof_finished(False, 9999.0)
    samples = parse(metrics)
    assert value(samples, "cuzk_supervisor_proofs_completed_total") == 2
    assert value(samples, "cuzk_supervisor_proofs_failed_total") == 1
    assert value(samples, "cuzk_supervisor_proof_duration_seconds_count") == 2
    assert value(samples, "cuzk_supervisor_proof_duration_seconds_sum") == pytest.approx(1500.2)
    bucket = "cuzk_supervisor_proof_duration_seconds_bucket"
    assert value(samples, bucket, le="0.1") == 0
    assert value(samples, bucket, le="0.25") == 1
    assert value(samples, bucket, le="1200.0") == 1
    assert value(samples, bucket, le="1800.0") == 2
    assert value(samples, bucket, le="+Inf") == 2


def test_buckets_span_a_simulated_proof_to_a_first_real_warmup():
    assert PROOF_BUCKETS[0] <= 0.1
    assert PROOF_BUCKETS[-1] >= 3600
    assert list(PROOF_BUCKETS) == sorted(PROOF_BUCKETS)


def test_bench_rate_memory_and_outbox():
    metrics = SupervisorMetrics()
    metrics.bench_rate(61.5)
    metrics.memory(3 * GIB, RiskLevel.WARN)
    metrics.outbox_depth(4)
    metrics.manager_request_failed("running")
    metrics.manager_request_failed("running")
    metrics.manager_request_failed("log_push")
    samples = parse(metrics)
    failed = "cuzk_supervisor_manager_failed_requests_total"
    assert value(samples, failed, call="running") == 2
    assert value(samples, failed, call="log_push") == 1
    assert value(samples, "cuzk_supervisor_bench_rate_proofs_per_hour") == 61.5
    assert value(samples, "cuzk_supervisor_memory_headroom_bytes") == 3 * GIB
    assert value(samples, "cuzk_supervisor_oom_risk_level") == 1
    assert value(samples, "cuzk_supervisor_manager_outbox_depth") == 4
    metrics.memory(0, RiskLevel.CRITICAL)
    assert value(parse(metrics), "cuzk_supervisor_oom_risk_level") == 2
    metrics.memory(10 * GIB, RiskLevel.OK)
    assert value(parse(metrics), "cuzk_supervisor_oom_risk_level") == 0


def test_gpus_per_device_and_a_vanished_device_loses_its_series():
    metrics = SupervisorMetrics()
    metrics.gpus([device(0, "NVIDIA H200", 12, 141), device(1, "NVIDIA H200", 30, 141)])
    samples = parse(metrics)
    used = "cuzk_supervisor_gpu_memory_used_bytes"
    total = "cuzk_supervisor_gpu_memory_capacity_bytes"
    assert value(samples, used, gpu="0", name="NVIDIA H200") == 12 * GIB
    assert value(samples, used, gpu="1", name="NVIDIA H200") == 30 * GIB
    assert value(samples, total, gpu="1", name="NVIDIA H200") == 141 * GIB
    metrics.gpus([device(0, "NVIDIA H200", 13, 141)])
    samples = parse(metrics)
    assert value(samples, used, gpu="0", name="NVIDIA H200") == 13 * GIB
    assert (used, frozenset({("gpu", "1"), ("name", "NVIDIA H200")})) not in samples
    assert (total, frozenset({("gpu", "1"), ("name", "NVIDIA H200")})) not in samples
    metrics.gpus([])
    assert not [key for key in parse(metrics) if key[0] in (used, total)]


def test_each_instance_has_its_own_series():
    a, b = SupervisorMetrics(), SupervisorMetrics()
    a.bench_rate(10)
    a.proof_finished(True, 1)
    assert value(parse(b), "cuzk_supervisor_bench_rate_proofs_per_hour") == 0
    assert value(parse(b), "cuzk_supervisor_proofs_completed_total") == 0


def test_render_is_the_classic_text_format():
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    body = SupervisorMetrics().render()
    assert isinstance(body, bytes)
    assert body.startswith(b"# HELP ")


def _verdict(bound: Bound, busy: float, limiter: float) -> Verdict:
    evidence = Evidence(samples=40, span_s=60.0, gpu_workers=2, gpus=1, partition_workers=5,
                        gpu_busy_share=busy, synthesis_load=limiter)  # fmt: skip
    projections = (
        Projection("as-run", "as run", 5, 2, 1, 2, 41.0, "gpu"),
        Projection("one-more-gpu", "one more GPU", 5, 2, 2, 4, 70.5, "synthesis"),
    )
    return Verdict(bound, "2 GPU workers busy 97 %", evidence, projections=projections)


def test_the_bench_bound_its_evidence_and_projections_then_a_new_judgement_replaces_them():
    metrics = SupervisorMetrics()
    samples = parse(metrics)
    assert all(value(samples, "cuzk_supervisor_bench_bound", bound=b.value) == 0 for b in Bound)
    assert math.isnan(value(samples, "cuzk_supervisor_bench_gpu_busy_share"))
    assert math.isnan(value(samples, "cuzk_supervisor_bench_rate_uncertainty_ratio"))
    metrics.bench_rate(41.2, 0.004)
    metrics.bench_bound(_verdict(Bound.GPU, 0.97, 0.4))
    samples = parse(metrics)
    assert value(samples, "cuzk_supervisor_bench_bound", bound="gpu-bound") == 1
    assert value(samples, "cuzk_supervisor_bench_bound", bound="synthesis-bound") == 0
    assert value(samples, "cuzk_supervisor_bench_gpu_busy_share") == 0.97
    assert value(samples, "cuzk_supervisor_bench_synthesis_limiter_use") == 0.4
    assert value(samples, "cuzk_supervisor_bench_rate_uncertainty_ratio") == 0.004
    projected = "cuzk_supervisor_bench_projected_rate_proofs_per_hour"
    assert value(samples, projected, projection="one-more-gpu") == 70.5
    metrics.bench_bound(None)  # a later bench with sampling off: nothing judged, nothing left
    samples = parse(metrics)
    assert value(samples, "cuzk_supervisor_bench_bound", bound="gpu-bound") == 0
    assert math.isnan(value(samples, "cuzk_supervisor_bench_gpu_busy_share"))
    assert not [key for key in samples if key[0] == projected]
