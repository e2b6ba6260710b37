"""The generated tables are current (the README's exit codes, docs/configuration.md's settings),
and the exit-code table gives one meaning per code."""

import re

import pytest

from cuzk_supervisor import exitcodes, settings
from cuzk_supervisor.cli import readme
from cuzk_supervisor.errors import UsageError


@pytest.mark.parametrize("path", sorted(readme.GENERATED), ids=lambda p: p.name)
def test_generated_tables_are_current(path):
    text = path.read_text()
    assert readme.render(text, readme.GENERATED[path]) == text, "out of date: run `make readme`"


def test_every_setting_is_in_the_configuration_page():
    text = readme.CONFIGURATION.read_text()
    for decl in settings.declarations():
        assert f"| `{decl.name}` | `{decl.flag}` | `{decl.env}` |" in text


def _table() -> dict[str, str]:
    """The README's exit-code rows: code text → meaning."""
    text = readme.README.read_text()
    block = text.split("<!-- BEGIN exitcodes -->\n", 1)[1].split("<!-- END exitcodes -->", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \| (.+) \|$", block, flags=re.MULTILINE)
    return {code: meaning for code, meaning in rows if code not in ("code", "---")}


def test_every_exit_code_is_documented_once():
    codes = [
        v
        for k, v in vars(exitcodes).items()
        if k.isupper() and isinstance(v, int) and k != "SIGNAL_BASE"
    ]
    assert len(codes) == len(set(codes)), "two names for one code"
    assert sorted(exitcodes.MEANINGS) == sorted(codes), "a code without its meaning"
    table = _table()
    assert sorted(table) == sorted([*map(str, codes), "128 + N"])


# Each situation the table documents, as its row words it, and the one code it ends with.
SITUATIONS: list[tuple[str, int]] = [
    ("stopped cleanly by `--exit-after-run`", exitcodes.OK),
    ("a proof in a `prove` batch failed", exitcodes.FAILURE),
    ("`doctor` found a problem", exitcodes.FAILURE),
    ("a setting", exitcodes.USAGE),
    ("the C1 file", exitcodes.USAGE),
    ("a daemon binary that cannot run", exitcodes.USAGE),
    ("that cannot be written or made", exitcodes.USAGE),
    ("a unix socket path over the kernel's 107 bytes", exitcodes.USAGE),
    ("too little disk for the parameters and PCE files", exitcodes.USAGE),
    ("a simulator fault switch that does not parse", exitcodes.USAGE),
    ("address in use", exitcodes.DAEMON_FAILED_TO_START),
    ("never ready", exitcodes.DAEMON_FAILED_TO_START),
    ("`run_dir` or `log_dir` full", exitcodes.DAEMON_FAILED_TO_START),
    ("no daemon answered at the address", exitcodes.DAEMON_FAILED_TO_START),
    ("crash-looped", exitcodes.DAEMON_CRASH_LOOP),
    ("no plan fits the limit", exitcodes.OUT_OF_MEMORY),
    ("still out of memory at 1 worker", exitcodes.OUT_OF_MEMORY),
    ("below `min_rate`", exitcodes.BENCH_FAILED),
    ("no proof completed", exitcodes.BENCH_FAILED),
    ("no longer knows this instance (404)", exitcodes.INSTANCE_GONE),
    ("fetch failed, hung, or wrong files", exitcodes.PARAMS_FAILED),
    ("a write of the state file failed", exitcodes.STATE_UNWRITABLE),
    ("`state_dir` made read-only since the start", exitcodes.STATE_UNWRITABLE),
    ("the run phase found the machine broken", exitcodes.HEALTH_BROKEN),
    ("143 for SIGTERM", exitcodes.SIGNAL_BASE + 15),
]


@pytest.mark.parametrize(("situation", "code"), SITUATIONS, ids=[s for s, _ in SITUATIONS])
def test_each_documented_situation_has_one_code(situation: str, code: int) -> None:
    table = _table()
    key = "128 + N" if code > exitcodes.SIGNAL_BASE else str(code)
    assert situation in table[key]
    others = [other for other, meaning in table.items() if other != key and situation in meaning]
    assert others == [], f"{situation!r} is claimed by {key} and {others}"


def test_every_row_is_tied_to_a_situation():
    tied = {"128 + N" if c > exitcodes.SIGNAL_BASE else str(c) for _, c in SITUATIONS}
    assert tied == set(_table())


def test_a_refusal_before_the_start_is_exit_2():
    """Every refusal before the start is a UsageError (the values, the files, a state_dir that
    cannot be written: tests/test_prestart.py); a failed state write after it is exit 9
    (tests/test_files_e2e.py, tests/test_phase_machine.py)."""
    assert UsageError.exit_code == exitcodes.USAGE != exitcodes.STATE_UNWRITABLE
