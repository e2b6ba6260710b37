"""The start-up check of the instance label against what the manager's sweep can match."""

from __future__ import annotations

import pytest

from cuzk_supervisor.core.labels import is_platform_label, label_warning

URL = "http://manager:8080"


@pytest.mark.parametrize("label", ["C.1", "C.12345678", "C.007"])
def test_platform_labels_get_no_warning(label: str) -> None:
    assert is_platform_label(label)
    assert label_warning(label, URL) is None


@pytest.mark.parametrize(
    "label", ["my-box", "C.sim-demo", "C.", "c.123", "C.12a", "C.12 ", " C.12", "C.1\n", "X.12"]
)
def test_other_labels_get_one_warning_naming_the_label(label: str) -> None:
    assert not is_platform_label(label)
    warning = label_warning(label, URL)
    assert warning is not None
    assert repr(label) in warning
    assert "C.<digits>" in warning
    assert "instance disappeared from vast" in warning


@pytest.mark.parametrize("url", ["", "  "])
def test_no_warning_without_a_manager(url: str) -> None:
    assert label_warning("my-box", url) is None
