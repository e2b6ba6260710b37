# cuzk-supervisor: the container's entrypoint on a GPU proving machine.
#
#   docker build -t cuzk-supervisor .                                    # simulator-only image
#   docker build -t cuzk-prover --build-arg CUZK_BASE_IMAGE=<image with cuzk> .
#   docker run --rm cuzk-supervisor sim --exit-after-run                 # whole lifecycle, no GPU
#   docker run -d --gpus all --stop-timeout 60 -v cuzk-data:/data \
#       -e CUZK_SUPERVISOR_MANAGER_URL=http://manager:8080 -e MIN_RATE=30 \
#       -e VAST_CONTAINERLABEL=C.123 cuzk-prover
#
# Builds with the classic builder and with BuildKit alike, with no frontend image to fetch (no
# `# syntax=` line: the builder's own Dockerfile parser is enough) and no registry at all when
# CUZK_BASE_IMAGE is already local. `make image-test` builds it and runs it (deploy/image-test.sh).
#
# Reproducible: the base is a build argument that can be pinned by digest
# (`--build-arg CUZK_BASE_IMAGE=python:3.11-slim-bookworm@sha256:...`), and every Python package,
# the build backend included, is installed at the version in constraints.txt (`make
# constraints` makes it from pyproject.toml; tests/test_image.py checks the two agree).
#
# Secrets: none is ever a build argument or an ENV of this file, so none is in a layer or in
# `docker history`. The manager token (CUZK_SUPERVISOR_MANAGER_TOKEN) is given at run time
# (docker run -e, the platform's template, a Kubernetes Secret). The manager URL is baked in
# (CUZK_MANAGER_URL, below) or given at run time, which wins.

# The image that carries the cuzk binaries (`cuzk` on PATH, and the CUDA runtime they need). It
# must also have Python >= 3.11 with the venv module (name the interpreter with PYTHON if it is
# not `python3`). The default, a slim official Python image, has no cuzk: the image still builds
# and runs `sim`, which needs no GPU. A Debian bookworm with python3, python3-venv and
# ca-certificates does as well (deploy/image-test.sh makes one with debootstrap when no registry
# can be reached).
ARG CUZK_BASE_IMAGE=python:3.11-slim-bookworm

# --- builder: the runtime venv, complete --------------------------------------------------
# Built FROM the same base as the runtime, at the same path, so each binary wheel (grpcio,
# protobuf, psutil) fits the interpreter that will run it and the venv's links to that
# interpreter hold in the runtime stage, which copies the venv and nothing else.
FROM ${CUZK_BASE_IMAGE} AS builder
ARG PYTHON=python3
# Where pip finds packages (the versions are pinned by constraints.txt either way): PyPI, or a
# mirror; or, for a build with no network at all but the host's loopback (`--network host`),
# PIP_NO_INDEX=1 and PIP_FIND_LINKS=http://127.0.0.1:PORT/ serving the wheels of
# constraints.txt, as deploy/image-test.sh does. Build arguments reach pip as its environment.
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_FIND_LINKS=""
ARG PIP_NO_INDEX=0
RUN "${PYTHON}" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "cuzk-supervisor needs Python >= 3.11 in CUZK_BASE_IMAGE, found " + sys.version)' \
    && "${PYTHON}" -m venv /opt/build \
    && "${PYTHON}" -m venv --without-pip /opt/cuzk-supervisor
WORKDIR /src
# Only what the wheel is built from (.dockerignore keeps everything else out of the context).
COPY constraints.txt pyproject.toml README.md ./
COPY cuzk_supervisor ./cuzk_supervisor
# pip is the build venv's (ensurepip), a build tool in a stage that is thrown away; it installs
# into the runtime venv from outside (--python), so that venv never holds pip or setuptools.
# PIP_CONSTRAINT reaches the isolated build of the project's wheel too (setuptools, wheel).
ENV PIP_CONSTRAINT=/src/constraints.txt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN /opt/build/bin/pip wheel --wheel-dir /wheels . \
    && /opt/build/bin/pip --python /opt/cuzk-supervisor/bin/python install --no-index \
       --find-links=/wheels /wheels/cuzk_supervisor-*.whl \
    && /opt/build/bin/pip --python /opt/cuzk-supervisor/bin/python list --format=freeze \
    && /opt/cuzk-supervisor/bin/python -c 'import importlib.util as u, sys; left = [m for m in ("pip", "setuptools", "pkg_resources", "wheel") if u.find_spec(m)]; sys.exit(f"build tools in the runtime venv: {left}" if left else 0)'

# --- runtime -------------------------------------------------------------------------------
FROM ${CUZK_BASE_IMAGE} AS runtime
# Set by the build (deploy/image-test.sh passes pyproject.toml's version and `git rev-parse
# HEAD`); tests/test_image.py checks that VERSION's default is pyproject.toml's version.
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="cuzk-supervisor" \
      org.opencontainers.image.description="Supervisor for cuzk GPU proving instances" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"

ENV PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/cuzk-supervisor \
    PATH=/opt/cuzk-supervisor/bin:$PATH

# curl: the manager's status panel runs `ssh root@HOST curl -sf --max-time 3
# http://localhost:9821/status` (the daemon's HTTP status) in the container. Installed only where
# the base lacks it (an operator's cuzk image usually has it; the offline image test's base does).
# Not pinned: the version is the base distribution's, whichever that is.
# hadolint ignore=DL3008
RUN if ! command -v curl > /dev/null 2>&1; then \
        apt-get update \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends curl \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && curl --version > /dev/null

# The venv is all that is added: no wheel, no pip, no setuptools, nothing of the source tree.
COPY --from=builder /opt/cuzk-supervisor /opt/cuzk-supervisor
RUN cuzk-supervisor --help > /dev/null

# Paths on the persistent volume mounted at /data, so that a restarted or re-created container
# resumes from the state file (verified params are not fetched again, a finished bench is not
# rerun) and keeps the daemon's log. The parameter cache (/data/zk/params) and the C1 input
# (/data/zk/c1.json) are already there by default and deliberately not repeated here: `sim`
# redirects to its own folder only the settings left at their defaults. The daemon's rendered
# config and unix socket stay in the container (run_dir, default /run/cuzk-supervisor): they
# must not outlive it.
ENV CUZK_SUPERVISOR_STATE_DIR=/data/supervisor/state \
    CUZK_SUPERVISOR_LOG_DIR=/data/supervisor/log
# No VOLUME: the operator mounts /data (a named volume, a host disk, a PVC). An anonymous volume
# would copy whatever a cuzk base image keeps under /data (params are 100+ GB) at every create.

WORKDIR /var/lib/cuzk-supervisor

# The on-start hook. The manager deploys with `--ssh --direct` and `--onstart-cmd "nohup
# /usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &"`: the platform runs its own init
# instead of ENTRYPOINT, and this fixed path is the only thing that starts the proving stack. It
# starts `cuzk-supervisor run` in the background (its output in /var/log/cuzk-supervisor.log,
# rotated) and returns at once; a second run while it runs (the platform reruns it after a
# container restart) starts nothing. ENTRYPOINT below still serves `docker run` and Kubernetes.
COPY deploy/onstart.sh /usr/local/bin/entrypoint.sh

# Settings fixed per fleet, baked in at build time (the platform passes no manager URL):
#   --build-arg CUZK_MANAGER_URL=https://manager.example:8080
#   --build-arg 'CUZK_SETTINGS=bench_budget_s = 1800'     (more settings, as TOML text)
# written to /etc/cuzk-supervisor/settings.toml, read below flags, environment and config file.
# Every value is checked now, so a bad one fails the build. Never the token: a build argument
# is in `docker history` (the bake refuses every secret setting); give it at run time.
ARG CUZK_MANAGER_URL=""
ARG CUZK_SETTINGS=""
RUN chmod 0755 /usr/local/bin/entrypoint.sh \
    && python -m cuzk_supervisor.cli.bake --manager-url "${CUZK_MANAGER_URL}" \
       --settings "${CUZK_SETTINGS}"

# Root, on purpose: the daemon keeps the SRS in pinned (page-locked) host memory, which is
# bounded by RLIMIT_MEMLOCK for anyone without CAP_IPC_LOCK; the GPU device nodes, /data on the
# rental platform's disk and the volumes of most runtimes are root-owned; and on the rental
# platform the on-start hook runs as root anyway. The supervisor itself needs no privilege:
# where the runtime grants the devices and memlock to another user, run with --user.
# hadolint ignore=DL3002
USER 0:0

# Nothing is published. The health server (/healthz /startupz /readyz /metrics) listens on loopback
# (127.0.0.1:9822), which is all the HEALTHCHECK below needs; so does the daemon's status page
# (127.0.0.1:9821) that the manager reads over SSH. To reach the health server from outside set
# CUZK_SUPERVISOR_HEALTH_LISTEN=0.0.0.0:9822 and publish it to the host's loopback only:
# `-p 127.0.0.1:9822:9822`. The daemon's gRPC port is never published (no TLS, no auth).

# The supervisor turns SIGTERM into an orderly stop: the daemon gets SIGTERM, then SIGKILL after
# daemon_stop_grace_s (10 s), then the supervisor stops its own tasks and children and exits 143.
# Docker's default stop timeout is also 10 s, which would SIGKILL the supervisor in the middle of
# that: run with `--stop-timeout 60` (or `docker stop -t 60`).
STOPSIGNAL SIGTERM

# Liveness of the supervisor, with its own `healthcheck` command rather than curl: the
# interpreter is already here, while curl would be one more package (and CVE feed) in whatever
# base image carries cuzk. It reads the health address from the setting `sim` and `run` use
# (health_listen: flag, CUZK_SUPERVISOR_HEALTH_LISTEN, the config file; a wildcard address is
# probed on loopback), asks /healthz (the event loop is alive, in every phase and mode), and says
# why in one line when it fails (also with the health server off: health_enabled=false). The
# start period covers the parameter download and the warmup; a first success ends it early.
HEALTHCHECK --interval=30s --timeout=10s --start-period=30m --retries=3 \
    CMD ["cuzk-supervisor", "healthcheck"]

# No tini: the supervisor is a correct PID 1 itself (cuzk_supervisor/pid1.py): it reaps orphans,
# forwards stop signals to its children, becomes a child subreaper when it is not PID 1, and
# exits 128+N after signal N.
ENTRYPOINT ["cuzk-supervisor"]
CMD ["run"]
