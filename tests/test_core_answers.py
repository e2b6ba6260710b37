"""The pure rules of issue 31: what an answer from the manager's URL means, weather episodes,
and the log budget (core/answers.py, core/weather.py, core/logbudget.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cuzk_supervisor.core import logbudget
from cuzk_supervisor.core.answers import (
    GONE_TEXTS,
    Meaning,
    describe_answer,
    first_text_line,
    meaning,
)
from cuzk_supervisor.core.weather import WeatherEpisodes

REPORTS = ("/param-done", "/bench-done", "/running")
OTHERS = ("/register", "/status", "/api/log-push")


@pytest.mark.parametrize("path", REPORTS)
def test_only_the_managers_own_404_text_on_a_report_is_gone(path):
    assert meaning(path, 404, GONE_TEXTS[path]) is Meaning.GONE
    assert meaning(path, 404, GONE_TEXTS[path] + "\n") is Meaning.GONE
    assert meaning(path, 404, None) is Meaning.WEATHER  # HTML, plain, empty, foreign JSON
    assert meaning(path, 404, "not found") is Meaning.WEATHER
    assert meaning(path, 410, GONE_TEXTS[path]) is Meaning.WEATHER


def test_the_404_texts_are_the_managers_per_endpoint():
    assert GONE_TEXTS == {
        "/param-done": "instance not found",
        "/bench-done": "instance not found",
        "/running": "instance not found or already killed",
    }
    assert meaning("/param-done", 404, GONE_TEXTS["/running"]) is Meaning.WEATHER
    assert meaning("/running", 404, GONE_TEXTS["/param-done"]) is Meaning.WEATHER


@pytest.mark.parametrize("path", OTHERS)
def test_a_404_is_never_gone_where_the_manager_never_says_it(path):
    assert meaning(path, 404, "instance not found") is Meaning.WEATHER


@pytest.mark.parametrize("path", REPORTS + OTHERS)
def test_the_managers_json_400_is_rejected_a_proxys_is_weather(path):
    assert meaning(path, 400, "label is required") is Meaning.REJECTED
    assert meaning(path, 400, None) is Meaning.WEATHER


@given(st.integers(100, 599), st.sampled_from(REPORTS + OTHERS), st.none() | st.text())
def test_nothing_but_those_is_final(status, path, error):
    kind = meaning(path, status, error)
    if 200 <= status < 300:
        assert kind is Meaning.ANSWER
    elif kind is Meaning.GONE:
        assert status == 404
        assert error is not None
        assert error.strip() == GONE_TEXTS[path]
    elif kind is Meaning.REJECTED:
        assert status == 400
        assert error is not None
    else:
        assert kind is Meaning.WEATHER


def test_the_first_line_of_text_and_who_answered():
    page = "<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>...</body></html>"
    assert first_text_line(page) == "404 Not Found"
    assert first_text_line("404 page not found\n") == "404 page not found"
    assert first_text_line("") == ""
    assert first_text_line("x" * 500).endswith("…")
    assert describe_answer(404, "nginx/1.25.3", "404 Not Found") == (
        'HTTP 404 from nginx/1.25.3: "404 Not Found"'
    )
    assert describe_answer(404, None, "") == "HTTP 404 (no Server header), empty body"


def test_a_flapping_proxy_is_one_episode_told_once_and_its_end_once():
    episodes = WeatherEpisodes(sustained_s=600.0)
    told = []
    for t in range(0, 900, 30):  # a page every 30 s for 15 minutes, answers between
        said = episodes.weather(float(t), 404, "HTTP 404 from nginx")
        if said is not None:
            told.append((t, said.kind))
        if episodes.check(t + 15.0) is not None:
            told.append((t, "over"))
    assert told == [(600, "sustained")]
    assert episodes.sustained
    assert episodes.check(870 + 299.0) is None  # quiet for less than 300 s: still on
    over = episodes.check(870 + 300.0)
    assert over is not None
    assert over.kind == "over"
    assert over.answers == 30
    assert over.by_status == {404: 30}
    assert not episodes.active
    assert episodes.weather(2000.0, 503, "x") is None  # a new episode starts afresh
    assert episodes.episodes == 2


def test_a_short_episode_is_never_told():
    episodes = WeatherEpisodes(sustained_s=600.0)
    assert episodes.weather(0.0, 403, "x") is None
    assert episodes.weather(100.0, 403, "x") is None
    assert episodes.check(1000.0) is None  # over, never told
    assert not episodes.active


def test_a_budget_is_checked():
    with pytest.raises(ValueError, match="positive rates"):
        logbudget.Budget(20, 4, 0, 2, 10)
    with pytest.raises(ValueError, match="bursts"):
        logbudget.Budget(20, 4, 100, 0.5, 10)
    assert logbudget.BEFORE_RUN.with_bytes(24_000).burst_bytes == 12_000


def test_the_supervisors_tab_goes_first_then_the_oldest():
    assert logbudget.order_sources({"cuzk": 5, "benchdaemon": 2, "setup": 9}, "setup") == [
        "setup", "benchdaemon", "cuzk",
    ]  # fmt: skip
    assert logbudget.order_sources({"cuzk": 5}, "setup") == ["cuzk"]


@given(st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 100_000)), st.floats(0, 1e6))
def test_the_share_never_exceeds_the_room_nor_what_a_source_has(pending, room):
    shares = logbudget.share(pending, room)
    assert sum(shares.values()) <= room + 1e-6
    assert all(0 <= shares[s] <= pending[s] for s in pending)


def test_a_quiet_tab_sends_all_it_has_and_a_chatty_one_the_rest():
    assert logbudget.share({"setup": 300, "cuzk": 50_000}, 4000) == {"setup": 300, "cuzk": 3700}


def test_every_tabs_milestones_are_served_before_any_tabs_routine_lines():
    # cuzk has 3,000 bytes of milestones among 50,000; setup 300 of routine lines only
    shares = logbudget.share_by_class(
        {"cuzk": 3000, "setup": 0}, {"cuzk": 50_000, "setup": 300}, 4000
    )
    assert shares == {"cuzk": 3700, "setup": 300}
    shares = logbudget.share_by_class(
        {"cuzk": 3000, "setup": 0}, {"cuzk": 50_000, "setup": 3000}, 4000
    )
    assert shares["cuzk"] >= 3000


@given(
    st.dictionaries(
        st.sampled_from("abcdef"), st.tuples(st.integers(0, 50_000), st.integers(0, 50_000))
    ),
    st.floats(0, 1e6),
)
def test_the_share_by_class_never_exceeds_the_room_and_milestones_come_first(pending, room):
    milestones = {s: min(m, p) for s, (m, p) in pending.items()}
    total = {s: p for s, (_, p) in pending.items()}
    shares = logbudget.share_by_class(milestones, total, room)
    assert sum(shares.values()) <= room + 1e-6
    assert all(0 <= shares[s] <= total[s] for s in total)
    if sum(milestones.values()) <= room:
        assert all(shares[s] >= milestones[s] for s in total)
