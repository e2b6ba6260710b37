#!/usr/bin/env bash
# Start cuzk-supervisor from the rental platform's on-start hook instead of as the image's
# entrypoint (for images whose entrypoint the platform replaces, e.g. its SSH launch mode).
#
#   CUZK_SUPERVISOR_MANAGER_URL=http://manager:8080 bash /opt/cuzk/onstart.sh [RUN FLAGS...]
#   bash onstart.sh --foreground [RUN FLAGS...]   # when the platform already backgrounds us
#
# Default: the supervisor is started in the background (nohup, its own session, stdin closed),
# output appended to /var/log/cuzk-supervisor.log, its pid kept in a pidfile; the hook returns
# at once. A second start while it runs is a no-op, so a hook that runs twice is harmless, also
# at the same moment: the check and the start happen under a lock (flock on PIDFILE.lock).
# The log is bounded: past CUZK_ONSTART_LOG_MAX_BYTES (16 MiB) it is rotated to .1 … .N
# (CUZK_ONSTART_LOG_BACKUPS, 2). It is the supervisor's own output; the daemon's full log is
# the supervisor's rotating log_dir/cuzk.log.
# With --foreground the script becomes the supervisor (exec), for a platform that already runs
# the hook as `nohup <hook> > /var/log/entrypoint.log 2>&1 &`.
#
# In the image this file is /usr/local/bin/entrypoint.sh, the path the manager's deploy runs
# as its on-start command (`nohup /usr/local/bin/entrypoint.sh > /var/log/entrypoint.log 2>&1 &`):
# this hook's own lines go there, the supervisor's output to CUZK_ONSTART_LOG.
#
# Environment (every CUZK_SUPERVISOR_* setting is passed through as it is):
#   CUZK_SUPERVISOR_MANAGER_URL  the fleet manager's base URL; required unless the image has it
#                                baked in (manager_url in /etc/cuzk-supervisor/settings.toml,
#                                or CUZK_SUPERVISOR_IMAGE_SETTINGS_FILE): the platform does not
#                                pass it in
#   CUZK_SUPERVISOR_MANAGER_TOKEN  optional bearer token; give it in the platform's secret env,
#                                never on the command line of the hook
#   VAST_CONTAINERLABEL          the instance label (C.<id>), read by the supervisor itself
#   MIN_RATE                     proofs per hour to pass the bench, read by the supervisor itself
#   PAVAIL, PAVAIL_SERVER        for other programs of the image: passed on unchanged to the
#                                supervisor and its children
# A hook can start with fewer variables than the container's own process (PID 1) was given:
# VAST_CONTAINERLABEL, MIN_RATE, PAVAIL, PAVAIL_SERVER and the CUZK_SUPERVISOR_* variables that
# are missing here are taken from /proc/1/environ.
# Knobs of this script (not settings of the supervisor):
#   CUZK_ONSTART_BIN      supervisor command (default: cuzk-supervisor on PATH, else the image's
#                         /opt/cuzk-supervisor/bin/cuzk-supervisor)
#   CUZK_ONSTART_LOG      output file (default /var/log/cuzk-supervisor.log)
#   CUZK_ONSTART_LOG_MAX_BYTES  rotate the output file past this size (default 16777216)
#   CUZK_ONSTART_LOG_BACKUPS    rotated files kept (default 2)
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
            VAST_CONTAINERLABEL | MIN_RATE | PAVAIL | PAVAIL_SERVER | CUZK_SUPERVISOR_*) ;;
            *) continue ;;
        esac
        [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
        if [[ -z "${!name+set}" ]]; then
            export "$name=${entry#*=}"
        fi
    done < "$pid1_environ"
fi

# The URL baked into the image: a top-level `manager_url = "..."` line (before any [table]), as
# the bake writes it.
image_settings="${CUZK_SUPERVISOR_IMAGE_SETTINGS_FILE:-/etc/cuzk-supervisor/settings.toml}"
baked_url() {
    awk '/^[[:space:]]*\[/ { exit } /^manager_url = "[^"]/ { found = 1; exit } END { exit !found }' \
        "$image_settings" 2> /dev/null
}
if [[ -z "${CUZK_SUPERVISOR_MANAGER_URL:-}" ]] && ! baked_url; then
    log "CUZK_SUPERVISOR_MANAGER_URL is not set and $image_settings has no manager_url: the"
    log "manager's URL is not passed in by the platform; bake it into the image (docker build"
    log "--build-arg CUZK_MANAGER_URL=...) or set it in the template's environment"
    exit 2
fi
# The label can also be a flag (--label X, --label=X) or a key of a config file.
label_flag=0
config_file="${CUZK_SUPERVISOR_CONFIG_FILE:-}"
previous=""
for arg in "$@"; do
    case "$arg" in
        --label=?*) label_flag=1 ;;
        --config-file=?*) config_file="${arg#--config-file=}" ;;
    esac
    case "$previous" in
        --label) [[ -n "$arg" ]] && label_flag=1 ;;
        --config-file) config_file="$arg" ;;
    esac
    previous="$arg"
done
if ((!label_flag)) && [[ -z "${CUZK_SUPERVISOR_LABEL:-}" && -z "${VAST_CONTAINERLABEL:-}" ]] &&
    ! { [[ -n "$config_file" && -r "$config_file" ]] && grep -Eq '^[[:space:]]*label[[:space:]]*=' "$config_file"; }; then
    log "warning: no instance label (--label, CUZK_SUPERVISOR_LABEL, VAST_CONTAINERLABEL or"
    log "label in the config file); the supervisor will refuse to start without one"
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
log_max_bytes="${CUZK_ONSTART_LOG_MAX_BYTES:-16777216}"
log_backups="${CUZK_ONSTART_LOG_BACKUPS:-2}"
if ! [[ "$log_max_bytes" =~ ^[0-9]+$ && "$log_max_bytes" -ge 1024 && "$log_backups" =~ ^[0-9]+$ ]] ||
    ((log_backups < 1)); then
    log "CUZK_ONSTART_LOG_MAX_BYTES must be >= 1024 and CUZK_ONSTART_LOG_BACKUPS >= 1"
    exit 2
fi
pidfile="${CUZK_ONSTART_PIDFILE:-/run/cuzk-supervisor-onstart.pid}"
mkdir -p "$(dirname "$logfile")" "$(dirname "$pidfile")"

# One hook run at a time from here on: two at once would both find no supervisor and both start
# one. The lock is released when this script exits (its children do not inherit fd 9).
exec 9>> "$pidfile.lock"
if command -v flock > /dev/null 2>&1; then
    if ! flock -w 60 9; then
        log "another hook run holds $pidfile.lock for 60 s; not starting"
        exit 1
    fi
else
    log "warning: flock not found (util-linux); concurrent hook runs are not serialised"
fi

supervisor_runs() { # pid: is it our command? (a pidfile can outlive its process)
    local cmdline=""
    [[ "$1" =~ ^[0-9]+$ ]] || return 1
    cmdline="$(tr '\0' ' ' 2> /dev/null < "/proc/$1/cmdline" || true)"
    [[ "$cmdline" == *"$(basename "$bin") run"* ]]
}

# A pidfile can outlive its process (a container restart keeps the disk, not the processes, and
# pids are reused at once in a fresh pid namespace): it counts only if that pid runs our command.
if [[ -s "$pidfile" ]]; then
    old="$(< "$pidfile")"
    if supervisor_runs "$old"; then
        log "already running as pid $old (pidfile $pidfile); not starting another"
        exit 0
    fi
fi

# The output, appended to $logfile and rotated past $log_max_bytes, by awk (in every Debian
# base). The file names reach awk and the shell of its system() through the environment, never
# through quoting.
# shellcheck disable=SC2016 # $ROTATE_* are expanded by the shell that awk's system() starts
rotate_program='
    BEGIN {
        path = ENVIRON["ROTATE_PATH"]; max = ENVIRON["ROTATE_MAX"] + 0
        size = 0
        if ((getline first < path) >= 0) {
            close(path)
            cmd = "wc -c < \"$ROTATE_PATH\""
            if ((cmd | getline size) <= 0) size = 0
            close(cmd)
        }
    }
    {
        line = $0 "\n"
        if (size > 0 && size + length(line) > max) {
            close(path)
            system("i=$ROTATE_KEEP; while [ \"$i\" -gt 1 ]; do " \
                   "[ -e \"$ROTATE_PATH.$((i - 1))\" ] && mv -f \"$ROTATE_PATH.$((i - 1))\" \"$ROTATE_PATH.$i\"; " \
                   "i=$((i - 1)); done; mv -f \"$ROTATE_PATH\" \"$ROTATE_PATH.1\"")
            size = 0
        }
        printf "%s", line >> path
        fflush(path)
        size += length(line)
    }'

# mawk (Debian's awk) reads a pipe in blocks unless told to read line by line. Its version text
# is read whole before it is matched: `awk -W version | grep -q mawk` under pipefail is false
# whenever grep quits before awk has written its last line (awk gets SIGPIPE), and then every
# line of the supervisor sat in awk's buffer, not in the log, until 4 KiB had come.
awk_version=$(awk -W version 2>&1 < /dev/null || true)
awk_flags=()
if [[ "$awk_version" == *mawk* ]]; then
    awk_flags=(-W interactive)
fi

# setsid: its own session, so the hook's exit or a hangup of the hook's terminal does not reach
# it, nor its log writer (a dead writer would break the supervisor's stdout). Neither keeps the
# hook's own stdout or stderr open: whoever waits for the hook's output gets EOF at its exit.
launcher=()
if command -v setsid > /dev/null 2>&1; then
    launcher=(setsid)
fi
nohup ${launcher[@]+"${launcher[@]}"} "$bin" run "$@" \
    > >(exec ${launcher[@]+"${launcher[@]}"} env ROTATE_PATH="$logfile" ROTATE_MAX="$log_max_bytes" \
        ROTATE_KEEP="$log_backups" awk ${awk_flags[@]+"${awk_flags[@]}"} "$rotate_program" > /dev/null 2>&1 9>&-) \
    2>&1 < /dev/null 9>&- &
pid=$!
printf '%s\n' "$pid" > "$pidfile"
# Hold the lock until the new process shows as our command, so that a hook run waiting on the
# lock sees it running rather than a fork that has not exec'd yet.
for _ in $(seq 1 100); do
    supervisor_runs "$pid" && break
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.05
done
log "started $bin run (pid $pid), output in $logfile (rotated past $log_max_bytes bytes)"
