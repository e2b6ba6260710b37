#!/usr/bin/env python3
"""A stand-in for the platform's ``vastai`` CLI, for the image test's deploy path.

The simulated manager runs it as the real manager runs ``vastai`` (``--vastai PROG``), and it
does to a local Docker engine what the platform does to a rented machine (manager-api.md,
"Deploy"):

  create instance OFFER --image IMG --disk N --env "-e K=V ..." --ssh --direct --onstart-cmd CMD
      ``docker run -d`` of IMG with its entrypoint replaced by a long-lived init of the
      platform's own (``sleep infinity``: the supervisor is not PID 1), the --env values and
      VAST_CONTAINERLABEL=C.<id>, then CMD run inside the container (``sh -c``, as the
      platform's on-start does); prints ``Started. {'success': True, 'new_contract': ID}``
  reboot instance ID     restart the container (processes gone, disk kept) and rerun CMD
  destroy instance ID    remove the container
  show instances --raw   the containers it made, as a JSON array of {id, label, machine_id}

Environment: DOCKER (the client, default ``docker``) and DOCKER_HOST reach the engine;
VASTAI_STANDIN_NETWORK (default ``host``: the manager listens on the host's loopback);
VASTAI_STANDIN_EXTRA_ENV, NAME=VALUE lines added to every instance's environment (what a
platform template adds, e.g. a token). The id counter and each instance's on-start command are
kept in VASTAI_STANDIN_STATE (a folder). Python's standard library only.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

LABEL_KEY = "vastai-standin.id"
MACHINE_ID = 4242  # one host: every instance is on the same machine


def docker(*args: str, check: bool = True) -> str:
    cli = shlex.split(os.environ.get("DOCKER", "docker"))
    done = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise SystemExit(f"vastai-standin: docker {args[0]} failed: {done.stderr.strip()[-300:]}")
    return done.stdout


def state_dir() -> Path:
    folder = Path(os.environ.get("VASTAI_STANDIN_STATE", "/tmp/vastai-standin"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def next_id(folder: Path) -> int:
    counter = folder / "next-id"
    ident = int(counter.read_text()) if counter.exists() else 1000
    counter.write_text(str(ident + 1))
    return ident


def parse_env(text: str) -> list[str]:
    """``-e K=V -e K2=V2`` (the manager's --env value) to ``K=V`` items."""
    words = shlex.split(text)
    pairs = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "-e"]
    if len(pairs) * 2 != len(words):
        raise SystemExit(f"vastai-standin: --env must be '-e K=V' pairs: {text!r}")
    return pairs


def onstart(ident: int) -> None:
    command = (state_dir() / f"{ident}.onstart").read_text()
    docker("exec", "-d", f"vast-{ident}", "sh", "-c", command)


def create(args: list[str]) -> None:
    offer, options = args[0], args[1:]
    values: dict[str, str] = {}
    flags: set[str] = set()
    i = 0
    while i < len(options):
        name = options[i]
        if name in ("--ssh", "--direct"):
            flags.add(name)
            i += 1
        else:
            values[name] = options[i + 1]
            i += 2
    if flags != {"--ssh", "--direct"}:
        raise SystemExit("vastai-standin: the manager deploys with --ssh --direct")
    folder = state_dir()
    ident = next_id(folder)
    (folder / f"{ident}.onstart").write_text(values["--onstart-cmd"])
    env = parse_env(values.get("--env", ""))
    env += [line for line in os.environ.get("VASTAI_STANDIN_EXTRA_ENV", "").splitlines() if line]
    env.append(f"VAST_CONTAINERLABEL=C.{ident}")
    env_args = [part for pair in env for part in ("-e", pair)]
    docker(
        "run", "-d", "--name", f"vast-{ident}", "--label", f"{LABEL_KEY}={ident}",
        "--label", f"vastai-standin.offer={offer}",
        "--network", os.environ.get("VASTAI_STANDIN_NETWORK", "host"),
        *env_args, "--entrypoint", "sleep", values["--image"], "infinity",
    )  # fmt: skip
    onstart(ident)
    print(f"Started. {{'success': True, 'new_contract': {ident}}}")


def reboot(ident: int) -> None:
    docker("restart", "-t", "1", f"vast-{ident}")  # sleep as PID 1 ignores SIGTERM: a hard stop
    onstart(ident)
    print(f"Rebooting instance {ident}.")


def destroy(ident: int) -> None:
    docker("rm", "-f", f"vast-{ident}", check=False)
    print(f"destroying instance {ident}.")


def show() -> None:
    out = docker("ps", "-a", "--filter", f"label={LABEL_KEY}", "--format", "{{.Names}}")
    ids = sorted(
        int(name.removeprefix("vast-")) for name in out.split() if name.startswith("vast-")
    )
    print(json.dumps([{"id": i, "label": None, "machine_id": MACHINE_ID} for i in ids]))


def main(argv: list[str]) -> int:
    match argv:
        case ["create", "instance", *rest] if rest:
            create(rest)
        case ["reboot", "instance", ident]:
            reboot(int(ident))
        case ["destroy", "instance", ident]:
            destroy(int(ident))
        case ["show", "instances", "--raw"]:
            show()
        case _:
            sys.stderr.write(f"vastai-standin: not a command it knows: {shlex.join(argv)}\n")
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
