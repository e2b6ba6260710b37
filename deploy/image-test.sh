#!/usr/bin/env bash
# `make image-test`: build the image and check it against running containers.
#
#   1. the engine: Debian's docker.io is installed where dockerd is missing (apt-get update
#      first); a dockerd of our own is started on a private socket, data root and exec root (no
#      bridge, no iptables rules: every container runs with --network none) and stopped by its
#      pid when the test ends, however it ends;
#   2. the base: CUZK_BASE_IMAGE if given, else python:3.11-slim-bookworm if a registry answers,
#      else a Debian bookworm made with debootstrap from Debian's packages (python3,
#      python3-venv, ca-certificates), cached as a tarball in CUZK_IMAGE_TEST_CACHE
#      (/var/cache/cuzk-supervisor/image-test) and imported;
#   3. the build, offline: the wheels of constraints.txt are fetched by the host's pip (which
#      knows the host's index, proxy and CA) and served on the host's loopback, the only network
#      the build has (--network host, PIP_NO_INDEX=1);
#   4. the checks: `sim --exit-after-run` exits 0 under --network none; `docker run -d IMG sim`
#      turns healthy through the image's own HEALTHCHECK; the HEALTHCHECK command says why in one
#      line when the health server is off; `docker stop` ends the supervisor with 143 well within
#      the daemon's stop grace; the supervisor runs as the user docs/deployment.md says (root, 0:0); the
#      runtime venv holds no pip or setuptools; the OCI labels carry version and revision;
#   5. the deploy path, the manager's Deploy button end to end (deploy/deploy-test.py): the image
#      built again with the manager's URL and the fleet's settings baked in (CUZK_MANAGER_URL,
#      CUZK_SETTINGS: the simulated daemon where cuzk stands) and no token in `docker history`
#      or a layer (a token in CUZK_SETTINGS fails the build); the simulated manager on the
#      host's loopback with deploy/vastai-standin.py as its `vastai` gets `POST /api/deploy`:
#      the container (its own init, `sleep infinity`; the on-start command run in it) registers
#      with the baked URL and reaches `running` with its rate and its logs in the dashboard's
#      tabs, the status panel (curl to 9821 in the container) answering from the warmup on;
#      PAVAIL reaches the worker command, the token no child; a reboot resumes the same
#      instance; a deploy with MIN_RATE above the machine's rate ends with the container
#      destroyed. The deploy's containers share the host's network: 9821 and 9822 must be free;
#   6. the figures: image size, build time, stop time, deploy to running, total time (the last
#      line).
#
# If the engine cannot be had or started (not root, no apt-get, dockerd does not answer), the
# test says why and exits 0, so the rest of CI is unaffected; CUZK_IMAGE_TEST_REQUIRED=1 makes
# that a failure. Any failure after the engine is up is a failure (exit 1).
set -euo pipefail
cd "$(dirname "$0")/.."

started_at=$SECONDS
IMAGE="${CUZK_IMAGE_TEST_IMAGE:-cuzk-supervisor:image-test}"
CACHE_DIR="${CUZK_IMAGE_TEST_CACHE:-/var/cache/cuzk-supervisor/image-test}"
SUITE=bookworm
MIRROR="${CUZK_IMAGE_TEST_MIRROR:-http://deb.debian.org/debian}"
BASE_PACKAGES=python3,python3-venv,ca-certificates,curl
# Bump when the way the base is made changes (the cached tarball is then made again).
BASE_RECIPE=2
# The supervisor's own daemon_stop_grace_s default: `docker stop` must be done well before it.
STOP_GRACE_S=10
# What docs/deployment.md says the image runs as (section "Docker").
EXPECTED_USER=0:0

say() { printf 'image-test: %s\n' "$*"; }
fail() {
    say "FAIL: $*" >&2
    exit 1
}
cannot_run() {
    if [[ "${CUZK_IMAGE_TEST_REQUIRED:-0}" == 1 ]]; then
        fail "the engine cannot run here: $*"
    fi
    say "NOT RUN: the engine cannot run here: $*"
    say "(the rest of CI is unaffected; CUZK_IMAGE_TEST_REQUIRED=1 makes this a failure)"
    exit 0
}

work="$(mktemp -d /tmp/cuzk-image-test.XXXXXX)"
run_root="/run/cuzk-image-test.$$"
data_root="/var/lib/cuzk-image-test/run.$$"
dockerd_pid=""
wheel_server_pid=""
containers=()

cleanup() {
    local rc=$?
    set +e
    if [[ -n "$wheel_server_pid" ]]; then
        kill -TERM "$wheel_server_pid" 2> /dev/null
        wait "$wheel_server_pid" 2> /dev/null
    fi
    if [[ -n "$dockerd_pid" ]]; then
        for c in "${containers[@]}" $(docker ps -aq --filter label=vastai-standin.id 2> /dev/null); do
            docker rm -f "$c" > /dev/null 2>&1
        done
        kill -TERM "$dockerd_pid" 2> /dev/null
        for _ in $(seq 1 300); do
            kill -0 "$dockerd_pid" 2> /dev/null || break
            sleep 0.1
        done
        if kill -0 "$dockerd_pid" 2> /dev/null; then
            say "dockerd (pid $dockerd_pid) did not stop in 30 s: SIGKILL"
            kill -KILL "$dockerd_pid" 2> /dev/null
        fi
        # Its overlay mounts are gone with it; what is left is plain files.
        if grep -q " $data_root/" /proc/mounts; then
            say "mounts left under $data_root:"
            grep " $data_root/" /proc/mounts | cut -d' ' -f2 | sort -r | xargs -r -n1 umount -l
        fi
        # Except the host network namespace's handle that it bind-mounts for --network host
        # containers (exec root's netns/default), which it leaves behind.
        grep " $run_root/" /proc/mounts | cut -d' ' -f2 | sort -r | xargs -r -n1 umount -l
        rm -rf "$data_root" "$run_root"
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- 1. the engine -------------------------------------------------------------------------
if [[ "$(id -u)" != 0 ]]; then
    cannot_run "not root (dockerd and debootstrap need root)"
fi
# The deploy check (5.) runs the simulated manager from the project's venv.
venv_python="${VENV:-.venv}/bin/python"
[[ -x "$venv_python" ]] || fail "no $venv_python (the deploy check runs the simulated manager): make setup"
need_packages=()
command -v dockerd > /dev/null 2>&1 || need_packages+=(docker.io)
[[ -x /usr/bin/docker ]] || command -v docker > /dev/null 2>&1 || need_packages+=(docker.io)
if ((${#need_packages[@]} > 0)); then
    command -v apt-get > /dev/null 2>&1 || cannot_run "no dockerd and no apt-get to install docker.io"
    say "installing docker.io from Debian's packages"
    apt-get update -qq || cannot_run "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io \
        > "$work/apt.log" 2>&1 || cannot_run "apt-get install docker.io failed: $(tail -3 "$work/apt.log")"
fi
# The client of the same package as the engine (an older engine refuses a newer client's API).
if [[ -x /usr/bin/docker ]]; then
    DOCKER_CLI=/usr/bin/docker
else
    DOCKER_CLI="$(command -v docker)"
fi
docker() { DOCKER_HOST="unix://$run_root/docker.sock" "$DOCKER_CLI" "$@"; }

mkdir -p "$run_root" "$data_root"
say "starting dockerd ($(dockerd --version))"
dockerd --host "unix://$run_root/docker.sock" --data-root "$data_root" \
    --exec-root "$run_root/exec" --pidfile "$run_root/dockerd.pid" \
    --bridge none --iptables=false --ip-masq=false --ip-forward=false \
    > "$work/dockerd.log" 2>&1 &
dockerd_pid=$!
deadline=$((SECONDS + 60))
until docker version > /dev/null 2>&1; do
    if ! kill -0 "$dockerd_pid" 2> /dev/null; then
        dockerd_pid=""
        cannot_run "dockerd exited: $(tail -3 "$work/dockerd.log")"
    fi
    if ((SECONDS > deadline)); then
        cannot_run "dockerd did not answer within 60 s: $(tail -3 "$work/dockerd.log")"
    fi
    sleep 0.2
done
say "engine up: $(docker version --format 'server {{.Server.Version}}, client {{.Client.Version}}')"

# --- 2. the base ---------------------------------------------------------------------------
base="${CUZK_BASE_IMAGE:-}"
if [[ -z "$base" ]]; then
    if timeout 20 "$DOCKER_CLI" -H "unix://$run_root/docker.sock" pull -q python:3.11-slim-bookworm \
        > /dev/null 2>&1; then
        base=python:3.11-slim-bookworm
        say "base: $base (pulled)"
    else
        key="$(printf '%s\n' "$SUITE" "$MIRROR" "$BASE_PACKAGES" "$BASE_RECIPE" | sha256sum | cut -c1-16)"
        tarball="$CACHE_DIR/debian-$SUITE-$key.tar"
        if [[ -s "$tarball" ]]; then
            say "base: no registry; Debian $SUITE from the cache ($tarball)"
        else
            say "base: no registry; making Debian $SUITE with debootstrap ($BASE_PACKAGES)"
            command -v debootstrap > /dev/null 2>&1 || {
                apt-get update -qq
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                    debootstrap > "$work/apt.log" 2>&1 || fail "cannot install debootstrap"
            }
            rootfs="$work/rootfs"
            t0=$SECONDS
            debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$rootfs" \
                "$MIRROR" > "$work/debootstrap.log" 2>&1 ||
                fail "debootstrap failed: $(tail -5 "$work/debootstrap.log")"
            # What a slim image leaves out: package lists and caches (apt-get update brings them
            # back), docs, man pages, translations.
            rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* \
                "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/log/* "$rootfs"/tmp/* \
                "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
            find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'locale.alias' \
                -exec rm -rf {} +
            mkdir -p "$CACHE_DIR"
            tar --numeric-owner --xattrs -C "$rootfs" -cf "$tarball.tmp" .
            mv "$tarball.tmp" "$tarball"
            rm -rf "$rootfs"
            say "base: made in $((SECONDS - t0)) s, cached as $tarball ($(du -m "$tarball" | cut -f1) MB)"
        fi
        base="cuzk-image-test-base:$SUITE-$key"
        docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'CMD ["/bin/bash"]' "$tarball" "$base" > /dev/null
    fi
fi
base_mb=$(($(docker image inspect -f '{{.Size}}' "$base") / 1000000))
say "base image $base: $base_mb MB"

# --- 3. the build --------------------------------------------------------------------------
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)"
revision="$(git rev-parse HEAD 2> /dev/null || echo unknown)"
build_args=(--build-arg "CUZK_BASE_IMAGE=$base" --build-arg "VERSION=$version"
    --build-arg "REVISION=$revision")
# The wheels of constraints.txt, fetched here with the host's pip (its index, its proxy and CA
# settings) and served on the host's loopback: the build itself reaches no index, no registry.
wheelhouse="$work/wheels"
pip_cli="${VENV:-.venv}/bin/pip"
[[ -x "$pip_cli" ]] || pip_cli="python3 -m pip"
t0=$SECONDS
# shellcheck disable=SC2086 # pip_cli may be "python3 -m pip"
PIP_DISABLE_PIP_VERSION_CHECK=1 $pip_cli download --quiet --only-binary :all: --no-deps \
    -r constraints.txt -d "$wheelhouse" > "$work/pip.log" 2>&1 ||
    fail "pip download of constraints.txt failed: $(tail -5 "$work/pip.log")"
wheel_port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
python3 -m http.server --bind 127.0.0.1 --directory "$wheelhouse" "$wheel_port" \
    > "$work/wheels.log" 2>&1 &
wheel_server_pid=$!
deadline=$((SECONDS + 20))
until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$wheel_port/', timeout=1)" \
    2> /dev/null; do
    ((SECONDS < deadline)) || fail "the wheel server did not answer: $(cat "$work/wheels.log")"
    sleep 0.2
done
say "wheels: $(find "$wheelhouse" -name '*.whl' | wc -l) of constraints.txt in $((SECONDS - t0)) s, served on 127.0.0.1:$wheel_port"
build_args+=(--build-arg PIP_NO_INDEX=1 --build-arg "PIP_FIND_LINKS=http://127.0.0.1:$wheel_port/")
say "building $IMAGE (version $version, revision $revision)"
t0=$SECONDS
# The host's network for pip (our dockerd has no bridge); nothing else of the host is used.
DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-1}" docker build --network host "${build_args[@]}" \
    -t "$IMAGE" . > "$work/build.log" 2>&1 || {
    tail -40 "$work/build.log" >&2
    fail "docker build failed"
}
build_s=$((SECONDS - t0))
size_mb=$(($(docker image inspect -f '{{.Size}}' "$IMAGE") / 1000000))
say "built in $build_s s: $size_mb MB (base $base_mb MB, added $((size_mb - base_mb)) MB)"

# --- 4. the checks -------------------------------------------------------------------------
label() { docker image inspect -f "{{index .Config.Labels \"org.opencontainers.image.$1\"}}" "$IMAGE"; }
[[ "$(label version)" == "$version" ]] || fail "label version is '$(label version)', not $version"
[[ "$(label revision)" == "$revision" ]] || fail "label revision is '$(label revision)', not $revision"
say "ok: OCI labels version=$version revision=$revision"

docker run --rm --network none --entrypoint /opt/cuzk-supervisor/bin/python "$IMAGE" -c '
import importlib.util as u, sys
left = [m for m in ("pip", "setuptools", "pkg_resources", "wheel") if u.find_spec(m)]
sys.exit(f"build tools in the runtime venv: {left}" if left else 0)' ||
    fail "the runtime venv holds build tools"
say "ok: no pip, setuptools or wheel in the runtime venv"

t0=$SECONDS
if ! timeout 300 "$DOCKER_CLI" -H "unix://$run_root/docker.sock" run --rm --network none \
    "$IMAGE" sim --exit-after-run > "$work/sim.log" 2>&1; then
    tail -30 "$work/sim.log" >&2
    fail "sim --exit-after-run under --network none did not exit 0"
fi
grep -q "finished with exit code 0" "$work/sim.log" || fail "sim did not report exit code 0"
say "ok: sim --exit-after-run exited 0 under --network none in $((SECONDS - t0)) s"

# run mode: the entrypoint's own command against the simulated daemon where cuzk stands, in
# local mode (no manager URL: reports are logged), healthy through the same HEALTHCHECK. Started
# now, beside the long-running sim below, so that the two HEALTHCHECK intervals pass at once;
# checked after it.
run_env=(
    -e CUZK_SUPERVISOR_LABEL=C.1 -e CUZK_SUPERVISOR_DAEMON_BINARY=cuzk-sim-daemon
    -e "CUZK_SUPERVISOR_DAEMON_ARGS=--time-scale 200" -e CUZK_SUPERVISOR_RATE_TIME_SCALE=200
    -e CUZK_SUPERVISOR_PLAN_MEMORY_SCALE=1024 -e CUZK_SUPERVISOR_GPU_PROBE=none
    -e CUZK_SUPERVISOR_BENCH_BUDGET_S=13.5 -e CUZK_SUPERVISOR_C1_FILE=/tmp/c1.json
)
cid_run="$(docker run -d --network none "${run_env[@]}" --entrypoint sh "$IMAGE" -c \
    'python -m cuzk_supervisor.sim.daemon.c1 --out /tmp/c1.json --size-mb 0.2 && exec cuzk-supervisor run')"
containers+=("$cid_run")
run_started=$SECONDS

# The long-running sim: healthy through the image's own HEALTHCHECK (its interval, its command).
cid="$(docker run -d --network none "$IMAGE" sim)"
containers+=("$cid")
t0=$SECONDS
deadline=$((SECONDS + 180))
while :; do
    health="$(docker inspect -f '{{.State.Health.Status}}' "$cid")"
    [[ "$health" == healthy ]] && break
    [[ "$(docker inspect -f '{{.State.Running}}' "$cid")" == true ]] ||
        fail "the sim container stopped: $(docker logs --tail 20 "$cid" 2>&1)"
    ((SECONDS < deadline)) || fail "not healthy after 180 s (status $health): $(docker inspect -f '{{json .State.Health}}' "$cid")"
    sleep 1
done
probe="$(docker inspect -f '{{range .State.Health.Log}}{{.Output}}{{end}}' "$cid")"
say "ok: healthy after $((SECONDS - t0)) s through the HEALTHCHECK: $(printf '%s' "$probe" | head -1)"
if grep -q Traceback <<< "$probe"; then
    fail "the health log holds a traceback: $probe"
fi

user="$(docker inspect -f '{{.Config.User}}' "$IMAGE")"
uid="$(docker exec "$cid" sh -c 'sed -n "s/^Uid:[[:space:]]*\([0-9]*\).*/\1/p" /proc/1/status')"
gid="$(docker exec "$cid" sh -c 'sed -n "s/^Gid:[[:space:]]*\([0-9]*\).*/\1/p" /proc/1/status')"
[[ "$user" == "$EXPECTED_USER" && "$uid:$gid" == "$EXPECTED_USER" ]] ||
    fail "runs as $uid:$gid (USER $user), docs/deployment.md says $EXPECTED_USER"
say "ok: the supervisor (PID 1) runs as $uid:$gid, as docs/deployment.md says"

# The same command with the health server off: unhealthy, one line, no traceback.
set +e
off="$(docker exec -e CUZK_SUPERVISOR_HEALTH_LISTEN=127.0.0.1:1 "$cid" cuzk-supervisor healthcheck 2>&1)"
off_rc=$?
set -e
if [[ $off_rc != 1 || "$(wc -l <<< "$off")" != 1 ]] || grep -q Traceback <<< "$off"; then
    fail "healthcheck against no server: rc $off_rc, output: $off"
fi
say "ok: with no health server the HEALTHCHECK says (rc 1): $off"

t0="$(date +%s.%N)"
docker stop -t 60 "$cid" > /dev/null
stop_s="$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
code="$(docker inspect -f '{{.State.ExitCode}}' "$cid")"
[[ "$code" == 143 ]] || fail "docker stop: exit code $code, not 143: $(docker logs --tail 20 "$cid" 2>&1)"
awk -v s="$stop_s" -v g="$STOP_GRACE_S" 'BEGIN { exit !(s < g) }' ||
    fail "docker stop took $stop_s s, not within the stop grace ($STOP_GRACE_S s)"
say "ok: docker stop: exit 143 in $stop_s s (stop grace $STOP_GRACE_S s)"

deadline=$((run_started + 180))
while :; do
    health="$(docker inspect -f '{{.State.Health.Status}}' "$cid_run")"
    [[ "$health" == healthy ]] && break
    [[ "$(docker inspect -f '{{.State.Running}}' "$cid_run")" == true ]] ||
        fail "the run container stopped: $(docker logs --tail 20 "$cid_run" 2>&1)"
    ((SECONDS < deadline)) || fail "run mode not healthy after 180 s (status $health)"
    sleep 1
done
say "ok: run mode with the simulated daemon healthy after $((SECONDS - run_started)) s"
deadline=$((SECONDS + 120))
until docker logs "$cid_run" 2>&1 | grep -q '"phase": "run", "event": "phase.entered"\|phase.entered.*phase=run'; do
    [[ "$(docker inspect -f '{{.State.Running}}' "$cid_run")" == true ]] ||
        fail "the run container stopped: $(docker logs --tail 20 "$cid_run" 2>&1)"
    ((SECONDS < deadline)) || fail "run mode never reached the run phase: $(docker logs --tail 20 "$cid_run" 2>&1)"
    sleep 1
done
say "ok: run mode reached the run phase (register, params, plan, warmup, settle, bench, report)"
docker stop -t 60 "$cid_run" > /dev/null
code="$(docker inspect -f '{{.State.ExitCode}}' "$cid_run")"
[[ "$code" == 143 ]] || fail "run mode: docker stop gave exit code $code, not 143"
say "ok: run mode: docker stop gave 143"

# --- 5. the deploy path -------------------------------------------------------------------
# The manager's Deploy button, end to end (deploy/deploy-test.py): the image built again with
# the manager's URL and the fleet's settings baked in (build arguments; every layer but the
# bake's comes from the cache), the simulated daemon where cuzk stands, and the C1 input an
# operator's cuzk base image carries at /data/zk/c1.json added on top. The simulated manager runs
# on the host's loopback with deploy/vastai-standin.py as its `vastai`; the containers share the
# host's network, as the stand-in starts them.
for port in 9821 9822; do
    if python3 -c "import socket, sys; s = socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $port)) != 0)"; then
        fail "127.0.0.1:$port is taken on this host: the deploy's containers (host network) need it"
    fi
done
manager_port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
manager_url="http://127.0.0.1:$manager_port"
# The lifecycle runs 200 times faster than a machine's: so do the log pushes (a machine's budget,
# a push of 12 KB a minute in turns every 20 s, would leave the tabs to its next turns).
deploy_settings='daemon_binary = "cuzk-sim-daemon"
daemon_args = ["--time-scale", "200"]
rate_time_scale = 200.0
plan_memory_scale = 1024
gpu_probe = "none"
bench_budget_s = 13.5
worker_commands = ["cuzk-supervisor prove --log-format json; exec sleep 86400"]
log_push_early_interval_s = 1.0
log_push_interval_s = 1.0
log_budget_bytes_per_min = 200000
log_run_budget_bytes_per_min = 200000'
token="tok-$(python3 -c 'import secrets; print(secrets.token_hex(12))')"
t0=$SECONDS
# A token given as a build argument fails the build (the bake refuses every secret setting).
if DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-1}" docker build --network host "${build_args[@]}" \
    --build-arg "CUZK_MANAGER_URL=$manager_url" \
    --build-arg "CUZK_SETTINGS=manager_token = \"$token\"" -t "$IMAGE-refused" . \
    > "$work/build-token.log" 2>&1; then
    fail "a build with the manager token in CUZK_SETTINGS succeeded"
fi
grep -q "manager_token must not be baked" "$work/build-token.log" ||
    fail "the build with a token failed for another reason: $(tail -5 "$work/build-token.log")"
DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-1}" docker build --network host "${build_args[@]}" \
    --build-arg "CUZK_MANAGER_URL=$manager_url" --build-arg "CUZK_SETTINGS=$deploy_settings" \
    -t "$IMAGE-baked" . > "$work/build-baked.log" 2>&1 || {
    tail -40 "$work/build-baked.log" >&2
    fail "docker build with CUZK_MANAGER_URL and CUZK_SETTINGS failed"
}
deploy_image="$IMAGE-deploy"
printf 'FROM %s\nRUN mkdir -p /data/zk \\\n    && python -m cuzk_supervisor.sim.daemon.c1 --out /data/zk/c1.json --size-mb 0.2\n' \
    "$IMAGE-baked" | DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-1}" docker build --network none -t "$deploy_image" - \
    > "$work/build-deploy.log" 2>&1 || {
    tail -20 "$work/build-deploy.log" >&2
    fail "docker build of the deploy image failed"
}
deploy_build_s=$((SECONDS - t0))
t0=$SECONDS
baked="$(docker run --rm --network none --entrypoint cat "$deploy_image" /etc/cuzk-supervisor/settings.toml)"
grep -qxF "manager_url = \"$manager_url\"" <<< "$baked" || fail "the baked settings file: $baked"
# The build arguments are in `docker history` (so this check sees them); the token is not, nor in
# any layer (the token reaches the containers at run time only, through the platform's env).
history="$(docker history --no-trunc --format '{{.CreatedBy}}' "$deploy_image")"
grep -qF "$manager_url" <<< "$history" || fail "docker history does not show the build arguments"
docker save -o "$work/deploy-image.tar" "$deploy_image"
if grep -qF "$token" <<< "$history" || grep -qaF "$token" "$work/deploy-image.tar"; then
    fail "the manager token is in docker history or a layer of $deploy_image"
fi
rm -f "$work/deploy-image.tar"
say "ok: deploy image $deploy_image: manager_url and settings baked (build args), a token in CUZK_SETTINGS fails the build, no token in docker history nor any layer (builds $deploy_build_s s, checks $((SECONDS - t0)) s)"
t0=$SECONDS
DOCKER="$DOCKER_CLI" DOCKER_HOST="unix://$run_root/docker.sock" CUZK_DEPLOY_TEST_TOKEN="$token" \
    "$venv_python" deploy/deploy-test.py --image "$deploy_image" --listen "127.0.0.1:$manager_port" \
    --work "$work" --standin deploy/vastai-standin.py --figures "$work/deploy-figures" ||
    fail "the deploy path (deploy/deploy-test.py)"
deploy_s=$((SECONDS - t0))
# deploy_to_running_s=… reboot_to_running_s=… failed_deploy_destroyed_s=…
deploy_figures="$(< "$work/deploy-figures")"
deploy_to_running="$(sed -n 's/.*deploy_to_running_s=\([0-9.]*\).*/\1/p' <<< "$deploy_figures")"
say "ok: the deploy path in $deploy_s s ($deploy_figures)"

# --- 6. the figures ------------------------------------------------------------------------
say "PASS: image $IMAGE $size_mb MB (base $base_mb MB), build $build_s s, docker stop $stop_s s (exit 143), deploy to running $deploy_to_running s, total $((SECONDS - started_at)) s"
