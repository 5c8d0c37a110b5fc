#!/usr/bin/env bash
# Try kit on a machine without a GPU: a real serving stack (the rendered compose file, nginx front
# door, TLS, keys) on a Docker engine, with the vLLM STAND-IN in place of vLLM (tests/standin: NOT
# vLLM; it loads no model and streams random word pieces, through vLLM 0.33.0's CLI and HTTP API).
#
#   scripts/try-without-gpu.sh [FOLDER]    # default ./kit-try; as root on Debian 12
#
# 1. An engine: the one that answers (DOCKER_HOST or the default socket), else one started by
#    scripts/dockerd.sh with its NVIDIA hook stub (left running; `scripts/dockerd.sh stop`).
# 2. The stand-in and nginx images, built here without a registry (tests/images/build.sh
#    --serving) and tagged with names of their own, $TRY_VLLM_IMAGE and $TRY_NGINX_IMAGE, which
#    the spec names (`images:`). The public names (vllm/vllm-openai:v0.33.0, nginx:1.27-alpine)
#    are never tagged, inspected or removed: whatever this engine holds under them stays as it is.
# 3. Proof that the engine gives containers GPUs (kit's services reserve them): one throw-away
#    container; an engine without an NVIDIA runtime or the stub is refused with the fix.
# 4. FOLDER/site.yaml, kept when it exists: site $KIT_TRY_SITE (default kit-try: the project
#    name on the engine, so two people trying kit on one engine each pick their own), one
#    service on "GPU 0", the front door on
#    https://localhost:$KIT_TRY_PORT (default 8443; plain HTTP redirect on $KIT_TRY_HTTP_PORT,
#    default 8080), models_root FOLDER/models holding a small model's config.json (all the
#    stand-in reads).
# 5. `kit up` (prints the generated password of user ops once), then an API key named `try` kept
#    in FOLDER/api-key (0600) for the README's examples; kit itself prints a key once and stores
#    only its SHA-256. Stop the stack with `kit down FOLDER/site.yaml`; remove the images with
#    `docker rmi kit-try/vllm-standin:v0.33.0 kit-try/nginx:1.26` (their own names only).
set -euo pipefail

REPO="$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" # a symlinked scripts/ too
FOLDER="${1:-kit-try}"
HTTPS_PORT="${KIT_TRY_PORT:-8443}"
HTTP_PORT="${KIT_TRY_HTTP_PORT:-8080}"
MODEL="qwen2.5-0.5b-instruct" # its published config.json: tests/data/models
SERVED_NAME="qwen2.5-0.5b"
SITE="${KIT_TRY_SITE:-kit-try}"
# The stand-in's and nginx's names here: never the public names the spec would default to.
TRY_VLLM_IMAGE="kit-try/vllm-standin:v0.33.0"
TRY_NGINX_IMAGE="kit-try/nginx:1.26"

log() { echo "try-without-gpu.sh: $*" >&2; }
die() {
    log "$*"
    exit 1
}
started=$SECONDS
step() { log "[$((SECONDS - started)) s] $*"; }

[ $# -le 1 ] || die "usage: $0 [FOLDER]"
[ "$(id -u)" = 0 ] || die "run it as root: it installs Debian packages and builds root filesystems"
python3 -c 'import kit' 2>/dev/null || die "kit is not installed: python3 -m pip install $REPO"
kit() { python3 -m kit "$@"; }
# kit's own allow-list of site names (kit.names.SITE_NAME), before anything is built or written
python3 -c 'import re, sys; from kit.names import SITE_NAME; sys.exit(not re.fullmatch(SITE_NAME, sys.argv[1]))' \
    "$SITE" || {
    log "KIT_TRY_SITE=$SITE is not a site name: a lowercase letter, then up to 30 lowercase" \
        "letters, digits or '-' (e.g. KIT_TRY_SITE=kit-try-$(id -un | tr -cd 'a-z0-9-' | head -c 20))"
    exit 2
}

step "1/5 a Docker engine"
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    log "using the engine that answers (${DOCKER_HOST:-the default socket})"
else
    bash "$REPO/scripts/dockerd.sh" start --engine-only
    log "the engine it started keeps running after this script: scripts/dockerd.sh stop"
fi

step "2/5 the stand-in and nginx images (tests/images/build.sh --serving)"
bash "$REPO/tests/images/build.sh" --serving --vllm-tag "$TRY_VLLM_IMAGE" \
    --nginx-tag "$TRY_NGINX_IMAGE"

step "3/5 GPU reservations on this engine"
bash "$REPO/scripts/dockerd.sh" gpus "$TRY_VLLM_IMAGE"

spec="$FOLDER/site.yaml"
if [ -e "$spec" ]; then
    step "4/5 $spec exists: kept as it is"
    grep -qF "images: {vllm: $TRY_VLLM_IMAGE, nginx: $TRY_NGINX_IMAGE}" "$spec" ||
        log "note: $spec does not name $TRY_VLLM_IMAGE and $TRY_NGINX_IMAGE (images:);" \
            "kit up runs the images it names (move it away to have it written again)"
else
    step "4/5 $spec"
    mkdir -p "$FOLDER/models/$MODEL"
    cp "$REPO/tests/data/models/$MODEL/config.json" "$FOLDER/models/$MODEL/"
    models="$(cd "$FOLDER/models" && pwd)"
    cat >"$spec.part" <<EOF
# Made by scripts/try-without-gpu.sh: the vLLM stand-in serves "$SERVED_NAME" (no weights: it
# reads config.json only). On a GPU server, start from \`kit init\` instead.
site: $SITE
domain: localhost
models_root: $models
# the images this script built, under names of their own (not vllm/vllm-openai, nginx)
images: {vllm: $TRY_VLLM_IMAGE, nginx: $TRY_NGINX_IMAGE}
healthcheck_interval: 2
tls: {mode: self-signed}
auth: {users: [ops], api_keys: true}
proxy: {bind: 127.0.0.1, https_port: $HTTPS_PORT, http_port: $HTTP_PORT}
services:
  - name: qwen
    model: $MODEL
    served_name: $SERVED_NAME
    gpus: [0]
    max_model_len: 4096
EOF
    mv "$spec.part" "$spec"
fi

step "5/5 kit up $spec"
kit up "$spec"
if [ ! -s "$FOLDER/api-key" ]; then
    added="$(kit keys add "$spec" try)"
    key="$(sed -n 's/^key try: //p' <<<"$added")"
    [ -n "$key" ] || die "kit keys add printed no key: $added"
    (umask 077 && printf '%s\n' "$key" >"$FOLDER/api-key")
fi
step "serving: $spec (key: $FOLDER/api-key, CA: \$(kit tls ca $spec)); stop: kit down $spec"
