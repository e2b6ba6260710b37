"""The README's generated parts are current, and it documents every exit code."""

from cuzk_supervisor import exitcodes
from cuzk_supervisor.cli import readme


def test_configuration_table_is_current():
    text = readme.README.read_text()
    assert readme.render(text) == text, "README is out of date: run `make readme`"


def test_every_exit_code_is_documented():
    text = readme.README.read_text()
    codes = {v for k, v in vars(exitcodes).items() if k.isupper() and k != "SIGNAL_BASE"}
    for code in codes:
        assert f"\n| {code} | " in text, f"exit code {code} missing from the README"
    assert "128 + N" in text
