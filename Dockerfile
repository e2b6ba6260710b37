# syntax=docker/dockerfile:1
#
# cuzk-supervisor: the container's entrypoint on a GPU proving machine.
#
#   docker build -t cuzk-supervisor .                                    # simulator-only image
#   docker build -t cuzk-prover --build-arg CUZK_BASE_IMAGE=<image with cuzk> .
#   docker run --rm cuzk-supervisor sim --exit-after-run                 # whole lifecycle, no GPU
#   docker run -d --gpus all --stop-timeout 60 -v cuzk-data:/data \
#       -e CUZK_SUPERVISOR_MANAGER_URL=http://manager:8080 -e MIN_RATE=30 \
#       -e VAST_CONTAINERLABEL=C.123 cuzk-prover
#
# Needs BuildKit (the default builder since Docker 23) for the bind mount of the wheels.
#
# Secrets: none is ever a build argument or an ENV of this file, so none is in a layer or in
# `docker history`. The manager token (CUZK_SUPERVISOR_MANAGER_TOKEN) and the manager URL are
# given at run time (docker run -e, the platform's template, a Kubernetes Secret/ConfigMap).

# The image that carries the cuzk binaries (`cuzk` on PATH, and the CUDA runtime they need). It
# must also have Python >= 3.11 with the venv module (name the interpreter with PYTHON if it is
# not `python3`). The default, a slim official Python image, has no cuzk: the image still builds
# and runs `sim`, which needs no GPU.
ARG CUZK_BASE_IMAGE=python:3.11-slim-bookworm

# --- builder: wheels of the project and of every dependency --------------------------------
# Built FROM the same base as the runtime so each binary wheel (grpcio, protobuf, psutil) fits
# the interpreter that will run it; the runtime then installs with --no-index (no network, no
# resolver surprises) and carries none of the build's leftovers.
FROM ${CUZK_BASE_IMAGE} AS builder
ARG PYTHON=python3
RUN "${PYTHON}" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "cuzk-supervisor needs Python >= 3.11 in CUZK_BASE_IMAGE, found " + sys.version)' \
    && "${PYTHON}" -m venv /opt/build
WORKDIR /src
# Only what the wheel is built from (.dockerignore keeps everything else out of the context).
COPY pyproject.toml README.md ./
COPY supervisor ./supervisor
# pip comes from the venv (ensurepip) and is used as shipped: it is a build tool in a stage that
# is thrown away. The project has no lock file, so the dependencies are the newest releases that
# pyproject.toml's lower bounds allow on the day of the build (the wheels' versions show in the
# build log); add a constraints file here if images must be rebuilt bit for bit.
RUN /opt/build/bin/pip wheel --no-cache-dir --wheel-dir /wheels . \
    && ls /wheels/cuzk_supervisor-*.whl

# --- runtime -------------------------------------------------------------------------------
FROM ${CUZK_BASE_IMAGE} AS runtime
ARG PYTHON=python3
LABEL org.opencontainers.image.title="cuzk-supervisor" \
      org.opencontainers.image.description="Supervisor for cuzk GPU proving instances" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/cuzk-supervisor \
    PATH=/opt/cuzk-supervisor/bin:$PATH

# The wheels are bind-mounted from the builder, so they are in no layer of this image: the venv
# is all that is added. Nothing else of the source tree (tests, .git, docs) is copied.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    "${PYTHON}" -m venv /opt/cuzk-supervisor \
    && /opt/cuzk-supervisor/bin/pip install --no-cache-dir --no-index --find-links=/wheels \
       /wheels/cuzk_supervisor-*.whl \
    && cuzk-supervisor --help > /dev/null

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

# Root, on purpose: the daemon keeps the SRS in pinned (page-locked) host memory, which is
# bounded by RLIMIT_MEMLOCK for anyone without CAP_IPC_LOCK; the GPU device nodes, /data on the
# rental platform's disk and the volumes of most runtimes are root-owned; and on the rental
# platform the on-start hook runs as root anyway. The supervisor itself needs no privilege:
# where the runtime grants the devices and memlock to another user, run with --user.
# hadolint ignore=DL3002
USER 0:0

# Nothing is published. The health server (/healthz /readyz /metrics) listens on loopback
# (127.0.0.1:9822), which is all the HEALTHCHECK below needs; so does the daemon's status page
# (127.0.0.1:9821) that the manager reads over SSH. To reach the health server from outside set
# CUZK_SUPERVISOR_HEALTH_LISTEN=0.0.0.0:9822 and publish it to the host's loopback only:
# `-p 127.0.0.1:9822:9822`. The daemon's gRPC port is never published (no TLS, no auth).

# The supervisor turns SIGTERM into an orderly stop: the daemon gets SIGTERM, then SIGKILL after
# daemon_stop_grace_s (10 s), then the supervisor stops its own tasks and children and exits 143.
# Docker's default stop timeout is also 10 s, which would SIGKILL the supervisor in the middle of
# that: run with `--stop-timeout 60` (or `docker stop -t 60`).
STOPSIGNAL SIGTERM

# Liveness of the supervisor, with Python rather than curl: the interpreter is already here for
# the supervisor, while curl would be one more package (and apt layer, and CVE feed) to add to
# whatever base image carries cuzk. The address follows CUZK_SUPERVISOR_HEALTH_LISTEN (a
# wildcard address is probed on loopback). The start period covers the parameter download and
# the warmup (the first proof builds the PCE cache); a first success ends it early, so a long one
# costs nothing on a healthy start. Turning the health server off (CUZK_SUPERVISOR_HEALTH_ENABLED
# =false) makes this check fail: pass --no-healthcheck to docker run then.
HEALTHCHECK --interval=30s --timeout=10s --start-period=30m --retries=3 \
    CMD ["/opt/cuzk-supervisor/bin/python", "-c", "import os, urllib.request as u; a = os.environ.get('CUZK_SUPERVISOR_HEALTH_LISTEN') or '127.0.0.1:9822'; h, _, p = a.rpartition(':'); h = {'': '127.0.0.1', '0.0.0.0': '127.0.0.1', '[::]': '[::1]'}.get(h, h); u.urlopen(f'http://{h}:{p}/healthz', timeout=5)"]

# No tini: the supervisor is a correct PID 1 itself (supervisor/pid1.py): it reaps orphans,
# forwards stop signals to its children, becomes a child subreaper when it is not PID 1, and
# exits 128+N after signal N.
ENTRYPOINT ["cuzk-supervisor"]
CMD ["run"]
