"""Params phase: skip when present, fetch with progress from bytes on disk, verify, fail clearly."""

import sys

import pytest

from supervisor.params import (
    ExpectedFile,
    ParamsFailed,
    ensure_params,
    missing,
    parse_expected,
    progress,
)


def test_progress_percent_rate_eta():
    p = progress([(0.0, 0), (10.0, 100 * 1024**2)], total_bytes=400 * 1024**2, started_at=0.0)
    assert p.percent == pytest.approx(25.0)
    assert p.rate_bytes_s == pytest.approx(10 * 1024**2)
    assert p.eta_s == pytest.approx(30.0)
    assert "25.0%" in p.line()
    assert "ETA 0m30s" in p.line()


def test_missing_names_wrong_and_absent_files():
    expected = parse_expected(["a.params:10", "b.vk:20"])
    assert missing(expected, {"a.params": 10, "b.vk": None}) == ["b.vk (have none, want 20)"]
    assert missing(expected, {"a.params": 9, "b.vk": 20}) == ["a.params (have 9, want 10)"]


def _writer_command(tmp_path, sizes, chunks=20, pause=0.05):
    """A fetch command that writes the files slowly (a real child process)."""
    script = tmp_path / "fetch.py"
    script.write_text(
        "import sys, time\n"
        f"sizes = {sizes!r}\n"
        "for name, size in sizes.items():\n"
        "    with open(name, 'wb') as f:\n"
        f"        for i in range({chunks}):\n"
        f"            f.write(b'x' * (size // {chunks})); f.flush(); time.sleep({pause})\n"
        f"        f.write(b'x' * (size - (size // {chunks}) * {chunks}))\n"
        "    print('fetched', name, flush=True)\n"
    )
    return f"{sys.executable} {script}"


async def test_fetch_shows_progress_then_skips_next_time(tmp_path):
    folder = tmp_path / "params"
    sizes = {"a.params": 2_000_000, "b.vk": 1_000_000}
    expected = [ExpectedFile(n, s) for n, s in sizes.items()]
    seen = []
    outcome = await ensure_params(
        folder, expected, _writer_command(tmp_path, sizes), timeout_s=60,
        progress_interval_s=0.1, on_progress=seen.append,
    )  # fmt: skip
    assert outcome.fetched
    assert len(seen) >= 3
    assert [p.done_bytes for p in seen] == sorted(p.done_bytes for p in seen)
    assert any(0 < (p.percent or 0) < 100 for p in seen)
    assert outcome.progress.done_bytes == sum(sizes.values())
    again = await ensure_params(folder, expected, "exit 1", timeout_s=60, progress_interval_s=0.1)
    assert not again.fetched


async def test_fetch_command_failing_is_a_reason(tmp_path):
    with pytest.raises(ParamsFailed, match="code 3"):
        await ensure_params(
            tmp_path / "p", [ExpectedFile("a", 1)], "echo nope; exit 3", timeout_s=30,
            progress_interval_s=0.1,
        )  # fmt: skip


async def test_fetch_command_hanging_is_stopped_after_the_timeout(tmp_path):
    with pytest.raises(ParamsFailed, match=r"still running after 0\.5 s"):
        await ensure_params(
            tmp_path / "p", [ExpectedFile("a", 1)], "sleep 600", timeout_s=0.5,
            progress_interval_s=0.1, stop_grace_s=0.5,
        )  # fmt: skip


async def test_fetch_that_writes_wrong_sizes_fails_verification(tmp_path):
    with pytest.raises(ParamsFailed, match=r"a\.params"):
        await ensure_params(
            tmp_path / "p", [ExpectedFile("a.params", 10)], "printf abc > a.params",
            timeout_s=30, progress_interval_s=0.1,
        )  # fmt: skip


async def test_missing_params_without_a_fetch_command_fail(tmp_path):
    with pytest.raises(ParamsFailed, match="no fetch command"):
        await ensure_params(
            tmp_path / "p", [ExpectedFile("a", 1)], "", timeout_s=30, progress_interval_s=0.1
        )
