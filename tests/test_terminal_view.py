"""Issue 14.1: the terminal view of run, sim and prove.

The mapping (cuzk_supervisor.cli.view) is pure and tested here on event dicts; the rendering
(cli.screen) on a rich console writing to a string; the wiring (cli.observe) through structlog.
The slow tests drive ``sim --exit-after-run`` on a pseudo-terminal, read the whole screen through
a small terminal emulator (what a person sees after the run), and run it again off a terminal.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import structlog
from ptyhelpers import clean_env, emulate, run_on_a_terminal
from simhelpers import free_tcp_port, quick_sim

from cuzk_supervisor.cli import observe
from cuzk_supervisor.cli.view import CLEAR, Line, Status, ViewModel, ViewOptions
from cuzk_supervisor.cli.viewtext import PHASES, describe, duration, exit_words, size

T0 = 1_800_000_000.0


def ev(event: str, at: float = 0.0, level: str = "info", /, **fields: Any) -> dict[str, Any]:
    stamp = datetime.fromtimestamp(T0 + at, UTC).isoformat().replace("+00:00", "Z")
    return {"event": event, "level": level, "timestamp": stamp, **fields}


def daemon_line(text: str, at: float = 0.0) -> dict[str, Any]:
    return ev("child.line", at, source="cuzk", stream="stdout", line=text)


def happy_path() -> list[dict]:
    """The events of one demo run that the view uses, in order, with daemon lines among them."""
    events = [
        ev("supervisor.started", 0, as_pid1=False, subreaper=True),
        ev("phase.entered", 0.1, phase="register"),
        ev("manager.registered", 0.2, label="C.1", uuid="u-1", runner_id=1),
        ev("phase.entered", 0.3, phase="params"),
        ev("params.fetch_started", 0.3, total_bytes=42_000_000),
        ev(
            "params.progress",
            0.8,
            done_bytes=21_000_000,
            total_bytes=42_000_000,
            rate_bytes_s=42_000_000,
            eta_s=0.5,
            elapsed_s=0.5,
        ),
        ev(
            "params.fetched",
            1.3,
            done_bytes=42_000_000,
            total_bytes=42_000_000,
            rate_bytes_s=42_000_000,
            eta_s=0,
            elapsed_s=1.0,
        ),
        ev("phase.entered", 1.4, phase="plan"),
        ev(
            "plan.made",
            1.4,
            summary="12 partition workers (warmup 2), total_budget 238GiB, "
            "1 GPU(s): 900 fit by 69 + 20 x W",
            full_workers=12,
            warmup_workers=2,
            total_budget_gib=238,
        ),
        ev("phase.entered", 1.5, phase="warmup"),
        daemon_line("INFO cuzk_daemon: cuzk-daemon starting", 1.6),
        ev("proof.submitted", 2.0, job_id="j0", attempt=1),
        ev("proof.completed", 5.0, job_id="j0", wall_s=3.0),
        ev("warmup.done", 5.0, wall_s=3.0, workers=2),
        ev("phase.entered", 5.1, phase="restart"),
        ev("daemon.replaced", 5.1, workers=12),
        ev("daemon.ready", 6.0, pid=2, startup_s=0.9),
        ev("phase.entered", 6.1, phase="settle"),
        ev("settle.done", 6.8, wall_s=0.7, workers=12),
        ev("phase.entered", 6.9, phase="bench"),
        ev("bench.started", 6.9, concurrency=2, max_proofs=4, budget_left_s=20),
    ]
    for n in range(4):
        events.append(daemon_line(f"INFO cuzk_core::engine: proof completed job {n}", 7.4 + n))
        events.append(ev("proof.completed", 7.5 + n, job_id=f"b{n}", wall_s=0.8))
        if n == 1:
            status = {"headroom_gib": 22.4, "risk": "ok", "bench_done": 2, "bench_planned": 4}
            status.update(phase="bench", rate_so_far=84.6, eta_s=2.0)
            events.append(ev("supervisor.status", 8.6, **status))
    events += [
        ev("bench.stretch_done", 10.6, submitted=4, completed=4, stopped="all 4 proofs submitted"),
        ev("phase.entered", 10.7, phase="report"),
        ev(
            "bench.result",
            10.7,
            rate=84.164,
            completed=4,
            measurement={"reason": "steady: 4 proofs over 3.0 s"},
        ),
        ev("manager.bench_verdict", 10.8, rate=84.164, passed=True),
        ev("bench.passed", 10.8, rate=84.164),
        ev("phase.entered", 10.9, phase="run"),
    ]
    return events


def feed_all(model: ViewModel, events) -> list:
    return [action for event in events for action in model.feed(event)]


def lines(actions, kind: str | None = None) -> list[Line]:
    return [a for a in actions if isinstance(a, Line) and (kind is None or a.kind == kind)]


# --- the mapping ---------------------------------------------------------------------------------


def test_one_line_per_phase_in_order_each_with_what_it_came_to():
    model = ViewModel(ViewOptions(command="sim", min_rate=30))
    shown = lines(feed_all(model, happy_path()))
    assert [(line.phase, line.mark) for line in shown] == [
        *((phase, "done") for phase in PHASES[:-1]),
        ("run", "running"),
    ]
    by_phase = {line.phase: line for line in shown}
    assert by_phase["register"].text == "runner 1, instance u-1"
    assert by_phase["params"].text == "40.1 MiB fetched in 1.0s (40.1 MiB/s)"
    assert by_phase["plan"].text == "12 workers (warmup 2), daemon memory budget 238 GiB, 1 GPU(s)"
    assert by_phase["warmup"].text == "1 proof in 3.0s at 2 workers"
    assert by_phase["restart"].text == "daemon ready at 12 workers in 0.9s"
    assert by_phase["bench"].text == "4 of 4 proofs done (all 4 proofs submitted)"
    assert by_phase["report"].text == "84.2 proofs/hour - passed (min_rate 30)"
    assert by_phase["run"].text == "proving at 12 workers; the daemon is kept up"
    assert by_phase["warmup"].took_s == pytest.approx(3.6)


def test_the_closing_lines_say_how_the_rate_was_measured_and_what_bounded_it():
    events = happy_path()
    at = events.index(next(e for e in events if e["event"] == "bench.result"))
    measurement = {"reason": "steady", "proofs": 6, "uncertainty_pct": 0.35, "stopped": "precision"}
    bound = {"bound": "gpu-bound", "reason": "2 GPU workers busy 97 % of the time"}
    events[at] = ev("bench.result", 10.7, rate=84.164, measurement=measurement, bound=bound)
    model = ViewModel(ViewOptions(min_rate=30))
    feed_all(model, events)
    summary = dict((line.label, line.text) for line in lines(model.close(0, T0 + 12.0)))
    assert summary["measured"] == "±0.3 %, 6 bench proofs, stopped: precision"
    assert summary["bound"] == "gpu-bound: 2 GPU workers busy 97 % of the time"


def test_daemon_lines_are_not_shown_unless_verbose():
    quiet = lines(feed_all(ViewModel(ViewOptions()), happy_path()))
    assert not [line for line in quiet if "cuzk_" in line.text]
    verbose = lines(feed_all(ViewModel(ViewOptions(verbose=True)), happy_path()), "child")
    assert verbose[0].text == "cuzk: INFO cuzk_daemon: cuzk-daemon starting"
    assert len(verbose) == 5


def test_verbose_shows_every_other_event_too():
    shown = lines(feed_all(ViewModel(ViewOptions(verbose=True)), happy_path()), "event")
    assert "supervisor.started (as_pid1 False, subreaper True)" in [line.text for line in shown]


def test_the_closing_summary_has_rate_plan_logs_and_exit():
    logs = (("events", "/l/supervisor.log"), ("daemon", "/l/cuzk.log"))
    model = ViewModel(ViewOptions(min_rate=30, logs=logs))
    feed_all(model, happy_path())
    closing = model.close(0, T0 + 12.0)
    assert closing[0] is CLEAR
    summary = [(line.label, line.text) for line in lines(closing)]
    assert summary == [
        ("rate", "84.2 proofs/hour - passed (min_rate 30)"),
        ("plan", "12 workers (warmup 2), daemon memory budget 238 GiB, 1 GPU(s)"),
        ("logs", "events /l/supervisor.log"),
        ("", "daemon /l/cuzk.log"),
        ("exit", "0 (ok) after 12s"),
    ]
    assert model.close(0, T0 + 13.0) == []  # once


def test_params_show_bytes_rate_and_eta():
    model = ViewModel()
    feed_all(model, happy_path()[:6])
    status = model.shown
    assert status is not None
    assert (status.phase, status.unit, status.done, status.total) == (
        "params", "bytes", 21_000_000, 42_000_000,
    )  # fmt: skip
    assert status.rate == "40.1 MiB/s"
    assert (status.eta_s, status.eta_at) == (0.5, pytest.approx(T0 + 0.8))


def test_params_without_expected_sizes_show_the_bytes_so_far():
    """The params phase's progress is the events' (the fetch no longer prints its own lines)."""
    model = ViewModel()
    feed_all(model, [
        ev("phase.entered", 0.1, phase="params"),
        ev("params.fetch_started", 0.2, total_bytes=None),
        ev("params.progress", 1.2, done_bytes=21_000_000, total_bytes=None,
           rate_bytes_s=42_000_000, eta_s=None, elapsed_s=1.0),
    ])  # fmt: skip
    status = model.shown
    assert status is not None
    assert (status.phase, status.unit, status.done, status.total) == ("params", "bytes", 21e6, None)
    assert status.rate == "40.1 MiB/s"
    s, _ = screen()
    assert "20.0 MiB so far · 40.1 MiB/s" in rendered(s.status(status, T0 + 2))


def test_a_kept_process_restarting_or_given_up_is_named():
    model = ViewModel()
    shown = lines(feed_all(model, [
        ev("phase.entered", 0.1, phase="run"),
        ev("daemon.restart_scheduled", 1.0, "warning", delay_s=2.0, attempt=1, reason="x"),
        ev("worker.crash_loop", 2.0, "error", worker="worker1", verdict="3 failures in 60 s"),
        ev("worker.start_failed", 3.0, "error", worker="curio", exit_reason="not found"),
    ]))  # fmt: skip
    assert [(line.kind, line.text) for line in shown[1:]] == [
        ("warning", "daemon restarts in 2.0s (attempt 1)"),
        ("error", "worker1 crash loop: 3 failures in 60 s"),
        ("error", "curio failed to start: not found"),
    ]


def test_warmup_and_settle_show_elapsed_against_the_usual_time_in_wall_seconds():
    model = ViewModel(ViewOptions(time_scale=100))
    events = happy_path()
    feed_all(model, events[: events.index(ev("phase.entered", 1.5, phase="warmup")) + 1])
    status = model.shown
    assert status is not None
    assert status.phase == "warmup"
    assert status.expected_s == pytest.approx(3.6)  # 6 minutes of daemon time at 100x
    assert status.since == pytest.approx(T0 + 1.5)
    assert "at 2 workers" in status.text
    model.feed(ev("phase.entered", 2.0, phase="settle"))
    assert model.shown is not None
    assert model.shown.expected_s == pytest.approx(0.9)


def test_bench_shows_proofs_done_of_planned_rate_so_far_and_eta():
    model = ViewModel()
    events = happy_path()
    cut = next(i for i, e in enumerate(events) if e["event"] == "supervisor.status") + 1
    feed_all(model, events[:cut])
    status = model.shown
    assert status is not None
    assert (status.phase, status.unit, status.done, status.total) == ("bench", "proofs", 2, 4)
    assert status.rate == "84.6 proofs/h so far"
    assert (status.eta_s, status.eta_at) == (2.0, pytest.approx(T0 + 8.6))
    assert "22.4 GiB memory headroom (ok)" in status.text


def test_a_warning_is_one_readable_line_and_a_repeat_is_counted_not_printed():
    model = ViewModel()
    model.feed(ev("phase.entered", 0, phase="plan"))
    warning = ev("manager.unavailable", 1, "warning", call="register", url="http://m",
                 attempts=3, reason="ConnectError: refused")  # fmt: skip
    first = lines(model.feed(warning))
    assert [(line.kind, line.text) for line in first] == [
        ("warning", "manager at http://m did not answer register: ConnectError: refused")
    ]
    again = model.feed({**warning, "timestamp": ev("x", 2)["timestamp"]})
    assert lines(again) == []
    assert model.shown is not None
    assert "(1 repeated warnings not shown)" in model.shown.text


def test_an_outage_of_the_manager_is_its_start_and_a_summary_a_minute():
    model = ViewModel()
    model.feed(ev("phase.entered", 0, phase="run"))
    away = ev("manager.away", 1, "warning", call="log_push", url="http://m",
              reason="HTTP 503: down", next_try_s=3.1)  # fmt: skip
    still = ev("manager.still_away", 61, "warning", url="http://m", away_s=60.0, failed=12,
               by_call={"log_push": 12}, reason="HTTP 503: down", next_try_s=40.0)  # fmt: skip
    assert [x.text for x in lines(model.feed(away))] == [
        "manager at http://m did not answer log_push: HTTP 503: down"
    ]
    assert [x.text for x in lines(model.feed(still))] == [
        "manager at http://m still away after 60.0s: 12 more failed requests (HTTP 503: down)"
    ]


def test_a_proxys_weather_that_lasts_is_one_clear_line_and_its_end_a_note():
    model = ViewModel()
    model.feed(ev("phase.entered", 0, phase="run"))
    last = 'HTTP 404 from nginx/1.25.3: "404 Not Found"'
    weather = ev("manager.weather", 601, "warning", url="http://m", minutes=10.0, answers=24,
                 by_status={404: 24}, last=last)  # fmt: skip
    over = ev("manager.weather_over", 900, url="http://m", minutes=14.5, answers=30, last="")
    assert [(x.kind, x.text) for x in lines(model.feed(weather))] == [(
        "warning",
        "for 10.0 min the manager's URL has answered with pages that are not the manager's "
        '(24 answers, the last HTTP 404 from nginx/1.25.3: "404 Not Found"): nothing is ended '
        "by them, reports are kept and retried",
    )]  # fmt: skip
    assert [x.text for x in lines(model.feed(over))] == [
        "the manager's own answers are back after 14.5 min of a proxy's pages"
    ]


def test_an_unknown_warning_shows_its_reason_and_a_few_fields():
    line = lines(ViewModel().feed(ev("gpu.odd", 0, "error", reason="lost", gpu=1, exception="tb")))
    assert [(x.kind, x.text) for x in line] == [("error", "gpu.odd: lost (gpu 1)")]


def test_a_failure_closes_its_phase_as_failed_and_says_why_in_the_summary():
    model = ViewModel()
    model.feed(ev("phase.entered", 0, phase="warmup"))
    crashed = model.feed(ev("daemon.exited", 1, "warning", exit_kind="crashed",
                            exit_reason="exited with code 1"))  # fmt: skip
    assert [x.text for x in lines(crashed)] == ["daemon crashed: exited with code 1"]
    failed = model.feed(ev("lifecycle.failed", 2, "error", reason="daemon: crash loop"))
    assert [(x.phase, x.mark, x.text) for x in lines(failed)] == [
        ("warmup", "failed", "daemon: crash loop")
    ]
    assert failed[-1] is CLEAR  # nothing live after the end
    summary = {x.label: x.text for x in lines(model.close(4, T0 + 3))}
    assert summary["failed"] == "in warmup: daemon: crash loop"
    assert summary["exit"] == "4 (daemon crash loop) after 3.0s"


def test_a_rate_below_min_rate_fails_the_report_line():
    model = ViewModel(ViewOptions(min_rate=50))
    feed_all(model, [ev("phase.entered", 0, phase="report"), ev("bench.result", 0, rate=20.0)])
    shown = lines(model.feed(ev("manager.bench_verdict", 1, rate=20.0, passed=False)))
    assert [(x.phase, x.mark) for x in shown] == [("report", "failed")]
    summary = {x.label: x.text for x in lines(model.close(6, T0 + 1))}
    assert summary["rate"] == "20.0 proofs/hour - failed: below min_rate 50"


def test_a_signal_stops_the_open_phase():
    model = ViewModel()
    feed_all(model, [ev("phase.entered", 0, phase="bench"), ev("supervisor.stopping", 1,
                                                                 signal="SIGTERM")])  # fmt: skip
    closing = lines(model.close(143, T0 + 2))
    assert (closing[0].phase, closing[0].mark) == ("bench", "stopped")
    assert closing[-1].text == "143 (stopped by SIGTERM) after 2.0s"


def test_an_interrupted_bench_says_so_on_its_line():
    model = ViewModel()
    events = [
        ev("phase.entered", 0, phase="bench"),
        ev("bench.interrupted", 1, "warning", cause="daemon crashed", completed=3, lost=2),
        ev("bench.stretch_done", 1, submitted=5, completed=3, stopped=""),
    ]
    feed_all(model, events)
    line = lines(model.feed(ev("phase.entered", 2, phase="settle")))[0]
    assert (line.phase, line.mark, line.text) == (
        "bench", "stopped", "interrupted after 3 proofs, 2 in flight lost",
    )  # fmt: skip


def test_a_known_warning_reads_as_words_with_its_fields():
    killed = ev("pid1.tree_killed", 0, "warning", terminated=0, killed=(25038,), survivors=())
    assert [x.text for x in lines(ViewModel().feed(killed))] == [
        "processes left at the end needed SIGKILL: pids 25038"
    ]


def test_waiting_for_the_manager_is_in_the_live_line():
    """``register_waiting`` is info (the client's ``manager.away`` warnings name the URL at
    their own cadence): the wait is in the live line, and no second warning line says it."""
    model = ViewModel()
    model.feed(ev("phase.entered", 0, phase="register"))
    waiting = ev("manager.register_waiting", 1, url="http://m", reason="refused")
    assert lines(model.feed(waiting)) == []
    assert model.shown is not None
    assert model.shown.text.startswith("waiting for the manager: http://m did not answer")
    loud = ev("manager.register_waiting", 2, "warning", url="http://m", reason="refused")
    assert [x.text for x in lines(model.feed(loud))] == [
        "manager at http://m did not answer: refused"
    ]


def local_run() -> list[dict]:
    """The happy path without a manager URL: nothing is sent, nobody judges the rate."""
    events = []
    for event in happy_path():
        if event["event"] == "manager.registered":
            event = ev("manager.report_skipped", 0.2, call="register", answer="local")
        elif event["event"] in ("manager.bench_verdict", "bench.passed"):
            continue
        events.append(event)
    at = events.index(next(e for e in events if e["event"] == "bench.result")) + 1
    events[at:at] = [
        ev("manager.report_skipped", 10.8, call="bench_done", judged=False),
        ev("bench.unjudged", 10.8, rate=84.164, reason="no manager configured"),
    ]
    return events


def test_a_local_runs_rate_is_shown_as_not_judged_never_as_passed():
    """Before: the lifecycle logged ``bench.passed`` after a rate nobody judged, and the view
    said "(not checked: no manager)" only when it had seen the skipped report."""
    model = ViewModel(ViewOptions(command="sim", min_rate=30))
    shown = lines(feed_all(model, local_run()))
    by_phase = {line.phase: line for line in shown if line.kind == "phase"}
    assert by_phase["report"].text == "84.2 proofs/hour (not judged: no manager)"
    closing = lines(model.close(0, T0 + 12.0))
    assert "84.2 proofs/hour (not judged: no manager)" in [x.text for x in closing]
    assert not [x.text for x in shown + closing if "passed" in x.text]
    # The event alone says it (a log fed without the manager's skipped report).
    alone = ViewModel(ViewOptions(min_rate=30))
    feed_all(alone, [e for e in local_run() if e["event"] != "manager.report_skipped"])
    assert alone.verdict == " (not judged: no manager)"


def test_the_live_line_is_sent_only_when_it_changes():
    model = ViewModel()
    first = model.feed(ev("phase.entered", 0, phase="plan"))
    assert [type(a) for a in first] == [Status]
    assert model.feed(ev("manager.report_done", 1)) == []


def prove_events(count: int = 3, concurrency: int = 1) -> list[dict]:
    """prove asks, waits, the daemon answers, one proof runs and ends, the next runs."""
    address = "127.0.0.1:9"
    return [
        ev("prove.started", 0, address=address, count=count, concurrency=concurrency,
           ready_deadline_s=30.0),
        ev("prove.waiting", 5, address=address, waited_s=5.0, deadline_s=30.0),
        ev("daemon.ready", 10, address=address, calls=3, waited_s=10.0),
        ev("proof.submitted", 10, job_id="j1", attempt=1),
        ev("proof.completed", 16, job_id="j1", wall_s=6.0, submissions=1, uploads_cut=0,
           total_ms=360_000),
        ev("prove.progress", 20, elapsed_s=10.0, count=count, done=1, failed=0, running=1,
           proof=2, proof_elapsed_s=4.0, partitions_done=4, partitions_total=10, eta_s=20.0),
    ]  # fmt: skip


def test_prove_shows_its_wait_then_the_proof_running_with_its_partitions():
    model = ViewModel(ViewOptions(command="prove"))
    events = prove_events()
    model.feed(events[0])
    asking = model.shown
    assert asking is not None
    assert (asking.text, asking.since, asking.expected_s, asking.expected_is_limit) == (
        "asking the daemon at 127.0.0.1:9", pytest.approx(T0), 30.0, True,
    )  # fmt: skip
    model.feed(events[1])
    assert model.shown is not None
    assert model.shown.text == "waiting for the daemon at 127.0.0.1:9 to answer"
    assert model.shown.since == pytest.approx(T0)
    model.feed(events[2])  # the daemon answered: the proofs run from now
    running = model.shown
    assert running is not None
    assert (running.text, running.since, running.done, running.total) == (
        "proof 1/3 running", pytest.approx(T0 + 10), 0, 3,
    )  # fmt: skip
    for event in events[3:]:
        model.feed(event)
    status = model.shown
    assert status is not None
    assert (status.done, status.total, status.unit, status.since) == (
        1, 3, "proofs", pytest.approx(T0 + 10),
    )  # fmt: skip
    assert status.text == "proof 2/3 running 4.0s, partitions 4/10"
    assert (status.eta_s, status.eta_at) == (20.0, pytest.approx(T0 + 20))


def test_one_proof_shows_its_elapsed_time_and_partitions_without_a_bar():
    model = ViewModel(ViewOptions(command="prove"))
    events = prove_events(count=1)
    feed_all(model, events[:3])
    progress = ev("prove.progress", 14, elapsed_s=4.0, count=1, done=0, failed=0, running=1,
                  proof=1, proof_elapsed_s=4.0, partitions_done=3, partitions_total=10)  # fmt: skip
    model.feed(progress)
    status = model.shown
    assert status is not None
    assert (status.text, status.since, status.unit, status.total) == (
        "proof 1/1 running, partitions 3/10", pytest.approx(T0 + 10), "", None,
    )  # fmt: skip


def test_concurrent_proofs_are_counted_as_running():
    model = ViewModel(ViewOptions(command="prove"))
    feed_all(model, prove_events(count=3, concurrency=2)[:3])
    assert model.shown is not None
    assert model.shown.text == "2 proofs running"


def test_each_proof_is_one_line_as_it_ends():
    model = ViewModel(ViewOptions(command="prove"))
    events = prove_events()
    shown = lines(feed_all(model, events))
    assert [(x.kind, x.phase, x.mark, x.took_s, x.text) for x in shown] == [
        ("phase", "proof 1/3", "done", 6.0, "ok, daemon time 6m00s, job j1"),
    ]
    failed = ev("proof.failed", 21, "warning", job_id="j2", wall_s=1.5, submissions=2,
                uploads_cut=1, status="failed", error="FAILED: boom")  # fmt: skip
    assert [(x.phase, x.mark, x.text) for x in lines(model.feed(failed))] == [
        ("proof 2/3", "failed", "failed: FAILED: boom, 2 submissions, 1 uploads cut, job j2"),
    ]
    assert model.shown is not None
    assert model.shown.text.endswith(", 1 failed")
    # In run and sim a failed proof stays a warning line, a completed one no line.
    run = ViewModel()
    assert [x.text for x in lines(run.feed(failed))] == ["proof failed: FAILED: boom"]
    assert lines(run.feed(events[4])) == []


def summary_event(**fields):
    base = {"address": "127.0.0.1:9", "count": 3, "concurrency": 2, "completed": 3, "failed": 0,
            "wall_s": 740.0, "proofs_per_hour": 14.595, "submissions": 4, "uploads_cut": 1,
            "daemon_seconds_per_second": 1.0021, "daemon_wall_s": 741.554,
            "daemon_proofs_per_hour": 14.564}  # fmt: skip
    return ev("prove.summary", 760, **{**base, **fields})


def test_the_prove_summary_gives_the_proofs_and_the_rate_in_wall_and_daemon_time():
    model = ViewModel(ViewOptions(command="prove"))
    feed_all(model, prove_events())
    actions = model.feed(summary_event())
    assert lines(actions) == []  # kept for the closing summary
    assert actions[-1] is CLEAR  # nothing runs any more
    closing = model.close(0, T0 + 761)
    assert closing[0] is CLEAR
    assert [(x.label, x.text) for x in lines(closing)] == [
        ("proofs", "3 completed, 0 failed (concurrency 2, 4 submissions, 1 uploads cut)"),
        ("rate", "14.6 proofs/hour in wall time (3 in 12m20s)"),
        ("", "14.6 proofs/hour in daemon time (12m21s of daemon time, x1.00 the wall clock)"),
        ("exit", "0 (ok) after 12m41s"),
    ]
    assert model.close(0, T0 + 762) == []


def test_the_prove_summary_names_what_bounded_the_rate():
    model = ViewModel(ViewOptions(command="prove"))
    bound = {"bound": "feed-bound", "reason": "concurrency 1 did not keep the pipeline full"}
    model.feed(summary_event(bound=bound))
    closing = [(x.label, x.text) for x in lines(model.close(0, T0 + 761))]
    assert ("bound", "feed-bound: concurrency 1 did not keep the pipeline full") in closing


def test_the_prove_summary_against_the_simulator_and_without_daemon_time():
    scaled = ViewModel(ViewOptions(command="prove"))
    scaled.feed(summary_event(wall_s=7.4, proofs_per_hour=1459.5, daemon_wall_s=740.0,
                              daemon_seconds_per_second=100.0, daemon_proofs_per_hour=14.595,
                              uploads_cut=0))  # fmt: skip
    texts = [x.text for x in lines(scaled.close(0, T0 + 761))]
    assert "3 completed, 0 failed (concurrency 2, 4 submissions)" in texts
    assert "1459.5 proofs/hour in wall time (3 in 7.4s)" in texts
    assert (
        "14.6 proofs/hour in daemon time (12m20s of daemon time, x100.00 the wall clock)" in texts
    )
    unknown = ViewModel(ViewOptions(command="prove"))
    unknown.feed(
        summary_event(
            completed=0,
            failed=1,
            proofs_per_hour=0.0,
            daemon_wall_s=None,
            daemon_seconds_per_second=None,
            daemon_proofs_per_hour=None,
        )
    )
    summary = [(x.label, x.text) for x in lines(unknown.close(1, T0 + 761))]
    assert ("", "daemon time unknown (no completed proof gave its total_ms)") in summary
    assert summary[-1][0] == "exit"
    assert summary[-1][1].startswith("1 (failed)")


def test_a_prove_that_never_reached_the_daemon_closes_with_its_exit_alone():
    model = ViewModel(ViewOptions(command="prove"))
    feed_all(model, prove_events()[:2])
    closing = model.close(3, T0 + 30)
    assert [(x.label, x.text) for x in lines(closing)] == [
        ("exit", "3 (daemon failed to start) after 30s")
    ]


def test_words_and_numbers():
    assert (size(512), size(42_000_000), size(3 * 1024**4)) == ("512 B", "40.1 MiB", "3.0 TiB")
    assert (duration(0.72), duration(42), duration(365), duration(7400)) == (
        "0.7s", "42s", "6m05s", "2h03m",
    )  # fmt: skip
    assert (exit_words(0), exit_words(130), exit_words(99)) == ("ok", "stopped by SIGINT", "failed")
    assert describe(ev("x.y", detail="d", n=1, pids=[1, 2], big=list(range(9)))) == (
        "x.y: d (n 1, pids 1, 2)"
    )


# --- the rendering -------------------------------------------------------------------------------


def rendered(text) -> str:
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(text)
    return out.getvalue().rstrip("\n")


def screen(width: int = 120):
    from cuzk_supervisor.cli.screen import Screen

    out = io.StringIO()
    s = Screen(out)
    s.console.width = width
    return s, out


def test_the_live_line_shows_bar_figures_and_words():
    s, _ = screen()
    status = Status("params", "downloading", since=T0, done=21e6, total=42e6, unit="bytes",
                    eta_s=10.0, eta_at=T0 + 1, rate="40.1 MiB/s")  # fmt: skip
    text = rendered(s.status(status, T0 + 4))
    assert "params" in text
    assert "20.0 MiB of 40.1 MiB · 40.1 MiB/s · ETA 7.0s · 4.0s  downloading" in text
    late = rendered(s.status(Status("warmup", "warmup proof", since=T0, expected_s=3.6), T0 + 5))
    assert "5.0s of about 3.6s, longer than usual  warmup proof" in late
    wait = Status("prove", "waiting", since=T0, expected_s=30, expected_is_limit=True)
    assert "12s of at most 30s  waiting" in rendered(s.status(wait, T0 + 12))


def test_the_live_line_fits_the_width():
    s, _ = screen(width=60)
    text = s.status(Status("bench", "benchmark " * 20, since=T0, done=1, total=12,
                           unit="proofs"), T0 + 1)  # fmt: skip
    assert len(text.plain) <= 59


def test_phase_warning_and_summary_lines():
    s, _ = screen()
    phase = rendered(s.line(Line("phase", "1 proof in 3.0s", phase="warmup", mark="done",
                                 took_s=3.6)))  # fmt: skip
    assert phase == " ✓ warmup     3.6s  1 proof in 3.0s"
    assert rendered(s.line(Line("warning", "memory ok -> warn"))) == "   ⚠ memory ok -> warn"
    assert rendered(s.line(Line("summary", "84.2 proofs/hour", label="rate"))) == (
        "\n rate   84.2 proofs/hour"
    )


# --- the wiring ----------------------------------------------------------------------------------


@pytest.fixture
def logging_restored() -> Iterator[None]:
    """These tests configure structlog for the whole process: its defaults come back after, or
    the level filter they set hides debug lines from a later test's ``capture_logs``."""
    yield
    structlog.reset_defaults()


@pytest.mark.usefixtures("logging_restored")
def test_on_a_terminal_the_view_prints_and_the_json_goes_to_the_events_file(tmp_path):
    out = io.StringIO()
    shipped: list[str] = []

    def ship(logger, method, event_dict):
        shipped.append(event_dict["event"])
        return event_dict

    events = tmp_path / "log" / "supervisor.log"
    view = observe.TerminalView(ViewOptions(), events_file=events, force=True)
    observe.configure_logging("warning", stream=out, extra_processors=[ship], view=view)
    try:
        log = structlog.get_logger()
        log.info("phase.entered", phase="plan")
        log.info("child.line", source="cuzk", stream="stdout", line="INFO cuzk_daemon: ready")
        log.warning("memory.risk_changed", previous="ok", risk="warn", reason="slope")
        log.info("phase.entered", phase="warmup")
    finally:
        observe.finish_view(0)
    screen_text = out.getvalue()
    assert "plan" in screen_text
    assert "memory risk changed (was ok): slope" in screen_text
    assert "cuzk_daemon" not in screen_text
    assert "exit   0 (ok)" in screen_text
    # The events file and the manager get what log_level lets through, as JSON lines.
    written = [json.loads(line) for line in events.read_text().splitlines()]
    assert [e["event"] for e in written] == ["memory.risk_changed"]
    assert shipped == ["memory.risk_changed"]
    assert observe.view_shown()


@pytest.mark.usefixtures("logging_restored")
def test_off_a_terminal_the_json_lines_stay_as_they_are():
    out = io.StringIO()
    view = observe.TerminalView(ViewOptions())
    observe.configure_logging("info", stream=out, view=view)
    structlog.get_logger().info("phase.entered", phase="plan")
    assert observe.finish_view(3) == 3
    (line,) = out.getvalue().splitlines()
    assert json.loads(line)["event"] == "phase.entered"


@pytest.mark.parametrize("command", ["run", "prove"])
def test_rich_is_not_imported_by_the_entrypoint(command):
    """structlog.dev tries ``import rich`` (cuzk_supervisor.logimport makes that fail at once):
    -X importtime lists that try as a bare ``rich``, as it lists colorama's; nothing is loaded."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cuzk_supervisor", command, "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "import time:" in done.stderr
    assert [line for line in done.stderr.splitlines() if re.search(r"\brich\.", line)] == []
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys; from cuzk_supervisor.cli import main, observe; "
         "main.build_parser(); print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert loaded.stdout.strip() == "[]"


# --- end to end on a pseudo-terminal -------------------------------------------------------------


def test_the_emulator_follows_a_live_line_and_its_erasure():
    assert emulate("a\r\nb\x1b[2K\rc\x1b[1Ad\r\n\r\ne") == ["ad", "c", "e"]


def sim_command(sim_dir: Path) -> list[str]:
    health = f"127.0.0.1:{free_tcp_port()}"
    return [sys.executable, "-m", "cuzk_supervisor", "sim", "--fresh", "--exit-after-run",
            "--sim-dir", str(sim_dir), "--health-listen", health, *quick_sim()]  # fmt: skip


@pytest.fixture(scope="module")
def terminal_run(tmp_path_factory) -> tuple[int, list[str]]:
    code, raw = run_on_a_terminal(sim_command(tmp_path_factory.mktemp("tty") / "sim"))
    return code, [line for line in emulate(raw) if line.strip()]


@pytest.mark.slow
def test_sim_on_a_terminal_shows_a_person_s_view(terminal_run):
    code, shown = terminal_run
    report = "\n".join(shown)
    assert code == 0, report
    assert len(shown) <= 40, report
    for phase in PHASES:
        assert any(re.match(rf"^ [✓▶] {phase}\b", line) for line in shown), (phase, report)
    assert any(re.match(r"^ rate +\d+\.\d proofs/hour - passed", line) for line in shown), report
    assert any(line.startswith(" exit   0 (ok)") for line in shown), report
    daemon = [line for line in shown if re.search(r"cuzk_(core|daemon|sim)\b|\bINFO\b", line)]
    assert daemon == [], report


@pytest.mark.slow
def test_sim_on_a_terminal_shows_no_warning(terminal_run):
    _, shown = terminal_run
    assert [line for line in shown if "⚠" in line or "✗" in line] == [], "\n".join(shown)


@pytest.mark.slow
def test_sim_off_a_terminal_gives_json_lines_each_event_once(tmp_path):
    done = subprocess.run(sim_command(tmp_path / "sim"), capture_output=True, text=True,
                          timeout=120, env=clean_env(), check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines_ = done.stderr.splitlines()
    events = [json.loads(line) for line in lines_]  # every line is one JSON event
    assert len(set(lines_)) == len(lines_)
    assert [e["phase"] for e in events if e["event"] == "phase.entered"] == list(PHASES)
    assert "phase run" in done.stdout
    assert not (tmp_path / "sim" / "log" / observe.EVENTS_FILE).exists()
