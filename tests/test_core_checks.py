"""core.checks: one way to validate a plain value, with a message that names what is wrong."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cuzk_supervisor.core.checks import (
    FINITE,
    NON_NEGATIVE,
    POSITIVE,
    Rule,
    in_range,
    int_above,
    int_at_least,
    is_int,
    is_number,
    number_above,
    number_at_least,
    require,
    require_fields,
    require_relation,
    require_value,
)
from cuzk_supervisor.core.risk import RiskPolicy


@dataclass(frozen=True)
class Backoff:
    base_s: float = 1.0
    max_s: float = 10.0
    tries: int = 3


def test_the_message_names_owner_field_rule_and_value() -> None:
    with pytest.raises(ValueError, match=r"^Backoff\.max_s must be > 0, got -1$"):
        require_fields(Backoff(max_s=-1), ("base_s", "max_s"), POSITIVE)
    with pytest.raises(ValueError, match=r"^f\.x must be an integer >= 1, got 'a'$"):
        require_value("f", "x", "a", int_at_least(1))
    with pytest.raises(ValueError, match=r"^o\.n must be odd, got 2$"):
        require(False, "o", "n", 2, "odd")
    require(True, "o", "n", 2, "odd")


def test_relations_say_the_rule_they_test() -> None:
    require_relation(Backoff(), "max_s", ">=", "base_s")
    require_relation(Backoff(max_s=1.0), "max_s", ">=", "base_s")
    with pytest.raises(ValueError, match=r"^Backoff\.max_s must be >= base_s \(1\.0\), got 0\.5$"):
        require_relation(Backoff(max_s=0.5), "max_s", ">=", "base_s")
    with pytest.raises(ValueError, match=r"must be < max_s \(10\.0\) or it never backs off"):
        require_relation(Backoff(base_s=10.0), "base_s", "<", "max_s", "or it never backs off")
    with pytest.raises(ValueError, match=r"must be <= max_s"):
        require_relation(Backoff(base_s=11.0), "base_s", "<=", "max_s")
    with pytest.raises(ValueError, match=r"must be > base_s"):
        require_relation(Backoff(max_s=1.0), "max_s", ">", "base_s")


def test_risk_policy_ordering_messages_agree_with_the_test() -> None:
    # Exits are easier to hold than entries: headroom exit >= enter, PSI exit <= enter.
    with pytest.raises(ValueError, match=r"critical_exit_headroom must be >= critical_enter"):
        RiskPolicy(critical_exit_headroom=0.03)
    with pytest.raises(ValueError, match=r"psi_warn_exit must be <= psi_warn_enter"):
        RiskPolicy(psi_warn_exit=20.0)


@pytest.mark.parametrize(
    ("rule", "good", "bad"),
    [
        (FINITE, [0, -1.5, 10**20], [math.nan, math.inf, True, "1", None]),
        (POSITIVE, [1e-9, 3], [0, -1, math.nan]),
        (NON_NEGATIVE, [0, 2.5], [-1e-9, math.nan]),
        (int_at_least(1), [1, 7], [0, 1.0, True, None]),
        (int_above(0), [1], [0, 2.0, False]),
        (number_above(0), [0.5, 2], [0, math.inf, math.nan, True]),
        (number_at_least(1), [1, 1.0, 3.5], [0.99, math.nan, True]),
        (in_range(0, 1), [0, 0.5, 1], [-0.1, 1.1, math.nan]),
        (in_range(0, 1, high_open=True), [0, 0.99], [1, 1.5]),
        (int_at_least(1).or_none(), [None, 2], [0, "x"]),
    ],
)
def test_rules(rule: Rule, good: list[object], bad: list[object]) -> None:
    assert all(rule(v) for v in good)
    assert not any(rule(v) for v in bad)


def test_rules_read_as_the_rest_of_a_sentence() -> None:
    assert int_at_least(2).text == "an integer >= 2"
    assert int_above(0).or_none().text == "None or an integer > 0"
    assert number_above(0).text == "a finite number > 0"
    assert in_range(0, 1, high_open=True).text == "in [0, 1)"
    assert in_range(0, 100).text == "in [0, 100]"


@given(st.one_of(st.integers(), st.floats(allow_nan=True), st.booleans(), st.none(), st.text()))
def test_number_and_int_predicates(value: object) -> None:
    assert is_int(value) == (type(value) is int)
    finite_float = isinstance(value, float) and math.isfinite(value)
    assert is_number(value) == (type(value) is int or finite_float)
