#!/usr/bin/env bash
# Start cuzk-supervisor from the rental platform's on-start hook instead of as the image's
# entrypoint (for images whose entrypoint the platform replaces, e.g. its SSH launch mode).
#
#   CUZK_SUPERVISOR_MANAGER_URL=http://manager:8080 bash /opt/cuzk/onstart.sh [RUN FLAGS...]
#   bash onstart.sh --foreground [RUN FLAGS...]   # when the platform already backgrounds us
#
# Default: the supervisor is started in the background (nohup, its own session, stdin closed),
# output appended to /var/log/cuzk-supervisor.log, its pid kept in a pidfile; the hook returns
# at once. A second start while it runs is a no-op, so a hook that runs twice is harmless.
# With --foreground the script becomes the supervisor (exec), for a platform that already runs
# the hook as `nohup <hook> > /var/log/entrypoint.log 2>&1 &`.
#
# Environment (every CUZK_SUPERVISOR_* setting is passed through as it is):
#   CUZK_SUPERVISOR_MANAGER_URL  required: the fleet manager's base URL (the platform does not
#                                pass it in)
#   CUZK_SUPERVISOR_MANAGER_TOKEN  optional bearer token; give it in the platform's secret env,
#                                never on the command line of the hook
#   VAST_CONTAINERLABEL          the instance label (C.<id>), read by the supervisor itself
#   MIN_RATE                     proofs per hour to pass the bench, read by the supervisor itself
# A hook can start with fewer variables than the container's own process (PID 1) was given:
# VAST_CONTAINERLABEL, MIN_RATE and the CUZK_SUPERVISOR_* variables that are missing here are
# taken from /proc/1/environ.
# Knobs of this script (not settings of the supervisor):
#   CUZK_ONSTART_BIN      supervisor command (default: cuzk-supervisor on PATH, else the image's
#                         /opt/cuzk-supervisor/bin/cuzk-supervisor)
#   CUZK_ONSTART_LOG      output file (default /var/log/cuzk-supervisor.log)
#   CUZK_ONSTART_PIDFILE  pidfile (default /run/cuzk-supervisor-onstart.pid)
#   CUZK_ONSTART_PID1_ENVIRON  where PID 1's environment is read (default /proc/1/environ)
set -euo pipefail

log() { printf 'cuzk-onstart: %s\n' "$*" >&2; }

foreground=0
if [[ "${1:-}" == "--foreground" ]]; then
    foreground=1
    shift
fi

# Fill in the variables this hook lacks from PID 1's environment (NUL-separated NAME=VALUE).
pid1_environ="${CUZK_ONSTART_PID1_ENVIRON:-/proc/1/environ}"
if [[ -r "$pid1_environ" ]]; then
    while IFS= read -r -d '' entry; do
        name="${entry%%=*}"
        case "$name" in
            VAST_CONTAINERLABEL | MIN_RATE | CUZK_SUPERVISOR_*) ;;
            *) continue ;;
        esac
        [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
        if [[ -z "${!name+set}" ]]; then
            export "$name=${entry#*=}"
        fi
    done < "$pid1_environ"
fi

if [[ -z "${CUZK_SUPERVISOR_MANAGER_URL:-}" ]]; then
    log "CUZK_SUPERVISOR_MANAGER_URL is not set: the manager's URL is not passed in by the"
    log "platform; set it in the image, the template's environment or the hook's command"
    exit 2
fi
if [[ -z "${CUZK_SUPERVISOR_LABEL:-}" && -z "${VAST_CONTAINERLABEL:-}" ]]; then
    log "warning: neither CUZK_SUPERVISOR_LABEL nor VAST_CONTAINERLABEL is set; the supervisor"
    log "will refuse to start without an instance label"
fi

# The same paths as the image's ENV: state on the persistent disk, so a restart resumes.
export CUZK_SUPERVISOR_STATE_DIR="${CUZK_SUPERVISOR_STATE_DIR:-/data/supervisor/state}"
export CUZK_SUPERVISOR_LOG_DIR="${CUZK_SUPERVISOR_LOG_DIR:-/data/supervisor/log}"
export PYTHONUNBUFFERED=1

bin="${CUZK_ONSTART_BIN:-}"
if [[ -z "$bin" ]]; then
    if command -v cuzk-supervisor > /dev/null 2>&1; then
        bin="cuzk-supervisor"
    else
        bin="/opt/cuzk-supervisor/bin/cuzk-supervisor"
    fi
fi
if ! command -v "$bin" > /dev/null 2>&1; then
    log "supervisor command not found: $bin (set CUZK_ONSTART_BIN)"
    exit 127
fi

if ((foreground)); then
    log "exec $bin run (arguments not shown: they may hold a token)"
    exec "$bin" run "$@"
fi

logfile="${CUZK_ONSTART_LOG:-/var/log/cuzk-supervisor.log}"
pidfile="${CUZK_ONSTART_PIDFILE:-/run/cuzk-supervisor-onstart.pid}"
mkdir -p "$(dirname "$logfile")" "$(dirname "$pidfile")"

# A pidfile can outlive its process (a container restart keeps the disk, not the processes, and
# pids are reused at once in a fresh pid namespace): it counts only if that pid runs our command.
if [[ -s "$pidfile" ]]; then
    old="$(< "$pidfile")"
    cmdline=""
    if [[ "$old" =~ ^[0-9]+$ ]]; then
        cmdline="$(tr '\0' ' ' 2> /dev/null < "/proc/$old/cmdline" || true)"
    fi
    if [[ "$cmdline" == *"$(basename "$bin") run"* ]]; then
        log "already running as pid $old (pidfile $pidfile); not starting another"
        exit 0
    fi
fi

# setsid: its own session, so the hook's exit or a hangup of the hook's terminal does not reach it.
launcher=()
if command -v setsid > /dev/null 2>&1; then
    launcher=(setsid)
fi
nohup ${launcher[@]+"${launcher[@]}"} "$bin" run "$@" >> "$logfile" 2>&1 < /dev/null &
pid=$!
printf '%s\n' "$pid" > "$pidfile"
log "started $bin run (pid $pid), output in $logfile"
