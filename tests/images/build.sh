#!/usr/bin/env bash
# Build the local images kit's end-to-end tests run, without any container registry.
#
#   tests/images/build.sh [--vllm-tag NAME]... [--nginx-tag NAME]...
#
# 1. A Debian bookworm root filesystem (python3, curl, nginx-light, libnginx-mod-http-js) made by
#    mmdebstrap from the Debian mirror apt already uses, cached as a tarball under
#    $KIT_TEST_CACHE (default /var/cache/kit-test) and imported as kit-test/base:<hash>.
# 2. The vLLM stand-in image (tests/standin: NOT vLLM, it imitates vLLM 0.33.0's CLI and HTTP
#    surface), ENTRYPOINT ["vllm", "serve"], tagged with every --vllm-tag (default
#    vllm/vllm-openai:v0.33.0) and kit-test/vllm-standin:latest.
# 3. An nginx image laid out like the official one (/etc/nginx/conf.d, /etc/nginx/modules with
#    ngx_http_js_module.so, user/group nginx 101:101, /var/cache/nginx, CMD nginx -g 'daemon off;',
#    STOPSIGNAL SIGQUIT), tagged with every --nginx-tag (default nginx:1.27-alpine) and
#    kit-test/nginx:1.22.
# 4. Debian's Prometheus (tests/images/prometheus.sh unpacks the package) tagged
#    prom/prometheus:v3.5.0 and kit-test/prometheus:debian; a Grafana STAND-IN (NOT Grafana,
#    tests/images/grafana-standin) tagged grafana/grafana:12.1.1 and
#    kit-test/grafana-standin:latest.
#
# Each image carries a label with the hash of its inputs; a re-run with unchanged inputs only
# re-tags (about a second). Needs a running Docker engine (scripts/dockerd.sh start) and root
# (it apt-get installs mmdebstrap when the base has to be built).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${KIT_TEST_CACHE:-/var/cache/kit-test}"
SUITE="bookworm"
PACKAGES="python3,curl,ca-certificates,nginx-light,libnginx-mod-http-js"
LABEL="kit.test.inputs"

# Official-image layout on top of Debian's nginx (run inside mmdebstrap on the new root "$1").
CUSTOMIZE=(
    'chroot "$1" groupadd --system --gid 101 nginx'
    'chroot "$1" useradd --system --uid 101 --gid nginx --no-create-home --home-dir /var/cache/nginx --shell /sbin/nologin nginx'
    'mkdir -p "$1/var/cache/nginx" "$1/etc/nginx/conf.d" && rm -f "$1/etc/nginx/sites-enabled/default"'
    # Debian's compiled-in temp dirs (/var/lib/nginx/*) land in /var/cache/nginx like the official
    # image's, so a read-only root with a tmpfs on /var/cache/nginx works.
    'rm -rf "$1/var/lib/nginx" && ln -s /var/cache/nginx "$1/var/lib/nginx"'
    'ln -sfn /usr/lib/nginx/modules "$1/etc/nginx/modules" && ln -sfn /usr/lib/nginx/modules "$1/usr/share/nginx/modules"'
    'ln -sf /dev/stdout "$1/var/log/nginx/access.log" && ln -sf /dev/stderr "$1/var/log/nginx/error.log"'
)

usage() {
    sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

vllm_tags=()
nginx_tags=()
while [ $# -gt 0 ]; do
    case "$1" in
    --vllm-tag) [ $# -ge 2 ] || usage; vllm_tags+=("$2"); shift 2 ;;
    --nginx-tag) [ $# -ge 2 ] || usage; nginx_tags+=("$2"); shift 2 ;;
    -h | --help) usage ;;
    *) echo "build.sh: unknown argument: $1" >&2; usage ;;
    esac
done
[ ${#vllm_tags[@]} -gt 0 ] || vllm_tags=("vllm/vllm-openai:v0.33.0")
[ ${#nginx_tags[@]} -gt 0 ] || nginx_tags=("nginx:1.27-alpine")
VLLM_IMAGE="kit-test/vllm-standin:latest"
NGINX_IMAGE="kit-test/nginx:1.22"
PROMETHEUS_IMAGE="kit-test/prometheus:debian"
GRAFANA_IMAGE="kit-test/grafana-standin:latest"
prometheus_tags=("prom/prometheus:v3.5.0")  # kit's pinned images.prometheus and images.grafana
grafana_tags=("grafana/grafana:12.1.1")

log() { echo "build.sh: $*" >&2; }

if ! docker info >/dev/null 2>&1; then
    log "no Docker engine answers; start one with scripts/dockerd.sh start"
    exit 1
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/build.lock"
flock 9 # one build at a time on this machine

debian_mirror() {
    local uri
    uri="$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
    if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
        uri="$(awk '$1 == "deb" && $2 !~ /^\[/ { print $2; exit }' /etc/apt/sources.list)"
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

ensure_base() {
    local key tarball
    key="$(printf '%s\n' "$SUITE" "$PACKAGES" "${CUSTOMIZE[@]}" | sha256sum | cut -c1-12)"
    BASE="kit-test/base:$key"
    if docker image inspect "$BASE" >/dev/null 2>&1; then
        return
    fi
    tarball="$CACHE/rootfs-$key.tar"
    if [ ! -s "$tarball" ]; then
        if ! command -v mmdebstrap >/dev/null; then
            log "installing mmdebstrap"
            DEBIAN_FRONTEND=noninteractive apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                mmdebstrap >/dev/null
        fi
        local hooks=() hook
        for hook in "${CUSTOMIZE[@]}"; do
            hooks+=(--customize-hook="$hook")
        done
        log "building the Debian $SUITE root filesystem (about 30 s, once)"
        mmdebstrap --quiet --format=tar --variant=apt --include="$PACKAGES" \
            --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
            --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/doc/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' \
            "${hooks[@]}" \
            "$SUITE" "$tarball.part" "deb $(debian_mirror) $SUITE main" \
            >"$CACHE/mmdebstrap.log" 2>&1 || {
            tail -n 30 "$CACHE/mmdebstrap.log" >&2
            rm -f "$tarball.part"
            exit 1
        }
        mv "$tarball.part" "$tarball"
    fi
    log "importing $BASE"
    docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'ENV LANG=C.UTF-8' \
        "$tarball" "$BASE" >/dev/null
    # Bases and root filesystems of earlier inputs are not needed any more.
    local old
    for old in "$CACHE"/rootfs-*.tar; do
        [ "$old" = "$tarball" ] || rm -f "$old"
    done
    docker image ls --format '{{.Repository}}:{{.Tag}}' kit-test/base | while read -r old; do
        [ "$old" = "$BASE" ] || docker rmi "$old" >/dev/null
    done
}

# build NAME DOCKERFILE CONTEXT PRIMARY TAG...: build PRIMARY unless it already has the same
# inputs, then give it the other tags.
build() {
    local name="$1" dockerfile="$2" context="$3" primary="$4"
    shift 4
    local inputs current
    inputs="$({
        docker image inspect --format '{{.Id}}' "$BASE"
        cat "$dockerfile"
        tar -C "$context" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - .
    } | sha256sum | cut -c1-16)"
    current="$(docker image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" \
        "$primary" 2>/dev/null || true)"
    if [ "$current" != "$inputs" ]; then
        log "building $name"
        # The legacy builder needs no BuildKit and works with the 20.10 and 28.x clients alike.
        DOCKER_BUILDKIT=0 docker build --quiet --file "$dockerfile" --build-arg "BASE=$BASE" \
            --label "$LABEL=$inputs" --label "kit.test.image=$name" --tag "$primary" \
            "$context" >/dev/null 2>"$work/build.log" || {
            cat "$work/build.log" >&2
            exit 1
        }
    fi
    local tag
    for tag in "$@"; do
        docker tag "$primary" "$tag"
    done
}

ensure_base

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Stand-in context: the stand-in's code (no tests' reference data) and the `vllm` command.
mkdir -p "$work/vllm/standin" "$work/vllm/bin"
cp "$REPO/tests/standin/vllm" "$REPO/tests/standin/README.md" \
    "$REPO/tests/standin/vllm-0.33.0-serve-flags.txt" "$work/vllm/standin/"
mkdir "$work/vllm/standin/vllm_standin"
cp "$REPO"/tests/standin/vllm_standin/*.py "$work/vllm/standin/vllm_standin/"
ln -s /opt/vllm-standin/vllm "$work/vllm/bin/vllm"
build vllm-standin "$HERE/vllm-standin.Dockerfile" "$work/vllm" "$VLLM_IMAGE" "${vllm_tags[@]}"

mkdir -p "$work/nginx"
cp "$HERE/nginx/nginx.conf" "$HERE/nginx/default.conf" "$work/nginx/"
build nginx "$HERE/nginx.Dockerfile" "$work/nginx" "$NGINX_IMAGE" "${nginx_tags[@]}"

# Observability: Debian's Prometheus as the pinned Prometheus image, and a Grafana STAND-IN
# (NOT Grafana: no Debian package, no registry) as the pinned Grafana image.
mkdir -p "$work/prometheus" "$work/grafana"
prometheus_dir="$(bash "$HERE/prometheus.sh")"
cp "$prometheus_dir/usr/bin/prometheus" "$prometheus_dir/usr/bin/promtool" "$work/prometheus/"
build prometheus "$HERE/prometheus.Dockerfile" "$work/prometheus" "$PROMETHEUS_IMAGE" \
    "${prometheus_tags[@]}"
cp "$HERE/grafana-standin/grafana_standin.py" "$work/grafana/"
build grafana-standin "$HERE/grafana-standin.Dockerfile" "$work/grafana" "$GRAFANA_IMAGE" \
    "${grafana_tags[@]}"

# Drop earlier builds of these images that lost their tags.
docker image prune --force --filter "label=kit.test.image" >/dev/null

for tag in "$VLLM_IMAGE" "${vllm_tags[@]}" "$NGINX_IMAGE" "${nginx_tags[@]}" \
    "$PROMETHEUS_IMAGE" "${prometheus_tags[@]}" "$GRAFANA_IMAGE" "${grafana_tags[@]}"; do
    docker image inspect --format "$tag {{.Id}} {{.Size}}" "$tag" |
        awk '{ printf "%-36s %.19s %4.0f MB\n", $1, $2, $3 / 1000000 }'
done
