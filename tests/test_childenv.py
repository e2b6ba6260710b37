"""Children get the environment minus the supervisor's secrets (issue 13, item 7)."""

from __future__ import annotations

import asyncio

from cuzk_supervisor import settings
from cuzk_supervisor.daemon.childenv import child_environ, is_secret_name, secret_names
from cuzk_supervisor.reaper import Reaper


def test_every_secret_setting_and_token_is_removed_the_rest_kept() -> None:
    secret_settings = {d.env for d in settings.declarations() if d.secret}
    assert "CUZK_SUPERVISOR_MANAGER_TOKEN" in secret_settings
    assert secret_names() == secret_settings
    base = {
        **dict.fromkeys(secret_settings, "s3cret"),
        "GITHUB_TOKEN": "x",
        "hf_token": "y",
        "PATH": "/usr/bin",
        "TOKENIZER": "kept",
        "CUZK_SUPERVISOR_LABEL": "C.1",
    }
    env = child_environ({"NO_COLOR": "1", "EXTRA_TOKEN": "z"}, base=base)
    assert env == {
        "PATH": "/usr/bin",
        "TOKENIZER": "kept",
        "CUZK_SUPERVISOR_LABEL": "C.1",
        "NO_COLOR": "1",
    }
    urls = child_environ(
        base={
            "CUZK_SUPERVISOR_MANAGER_URL": "https://u:pw@manager.example/",
            "CUZK_SUPERVISOR_OTHER_URL": "https://manager.example/?key=k",
            "CUZK_SUPERVISOR_PLAIN_URL": "https://manager.example/",
        }
    )
    assert urls == {"CUZK_SUPERVISOR_PLAIN_URL": "https://manager.example/"}
    assert is_secret_name("my_token")
    assert not is_secret_name("TOKENS")


def test_the_reapers_spawn_filters_whatever_it_is_given(monkeypatch) -> None:
    monkeypatch.setenv("CUZK_SUPERVISOR_MANAGER_TOKEN", "s3cret")
    monkeypatch.setenv("CUZK_TEST_KEPT", "kept")

    async def spawn_env(**kwargs: object) -> str:
        reaper = Reaper()
        proc = await reaper.spawn(
            "/usr/bin/env",
            stdout=asyncio.subprocess.PIPE,
            **kwargs,
        )
        out, _ = await proc.communicate()
        return out.decode()

    inherited = asyncio.run(spawn_env())
    given = asyncio.run(spawn_env(env={"A_TOKEN": "t", "CUZK_TEST_KEPT": "given"}))
    assert "s3cret" not in inherited
    assert "CUZK_TEST_KEPT=kept" in inherited
    assert given.split() == ["CUZK_TEST_KEPT=given"]
