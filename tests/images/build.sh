#!/usr/bin/env bash
# Build the local images kit's end-to-end tests run, without any container registry.
#
#   tests/images/build.sh [--serving] [--vllm-tag NAME]... [--nginx-tag NAME]...
#                         [--certbot-tag NAME]...
#
# --serving builds only steps 1-3 (what a site without observability or ACME runs; 4 minutes
# on a fresh, busy 2-core machine; scripts/try-without-gpu.sh uses it).
#
# 1. A Debian bookworm root filesystem (python3, curl, nginx-light, libnginx-mod-http-js) made by
#    mmdebstrap from the Debian mirror apt already uses, cached as a tarball under
#    $KIT_TEST_CACHE (default /var/cache/kit-test) and imported as kit-test/base:<hash>.
# 2. The vLLM stand-in image (tests/standin: NOT vLLM, it imitates vLLM 0.33.0's CLI and HTTP
#    surface), ENTRYPOINT ["vllm", "serve"], tagged with every --vllm-tag (default
#    vllm/vllm-openai:v0.33.0) and kit-test/vllm-standin:latest. Its root filesystem is the
#    base's plus python3-uvloop (vLLM serves on uvloop; so does the stand-in when it has it) and
#    python3-yaml (vLLM reads `--config FILE` with yaml.safe_load; so does the stand-in), built
#    and cached the same way.
# 3. Two nginx images laid out like the official one (/etc/nginx/conf.d, /etc/nginx/modules with
#    ngx_http_js_module.so, user/group nginx 101:101, /var/cache/nginx, CMD nginx -g 'daemon off;',
#    STOPSIGNAL SIGQUIT): Debian 13 (trixie) nginx 1.26.3 + njs 0.8.9 -- the nearest to the pinned
#    nginx:1.27-alpine (njs 0.8) -- as kit-test/nginx:1.26, tagged with every --nginx-tag (default
#    nginx:1.27-alpine); and Debian 12's nginx 1.22 + njs 0.7.9 as kit-test/nginx:1.22 (kit's front
#    door needs nginx >= 1.25.1, docs/compatibility.md: this one only runs the ACME tests' own
#    rate limiter, tests/support/acme_limiter).
# 4. Prometheus 3.5 (Debian forky's prometheus + promtool packages, unpacked and cached by
#    tests/images/prometheus.sh) tagged prom/prometheus:v3.5.0 and kit-test/prometheus:3; a
#    Alertmanager 0.33.1 (Debian forky's prometheus-alertmanager, `prometheus.sh alertmanager`)
#    tagged prom/alertmanager:v0.33.1 and kit-test/alertmanager:0.33; a
#    Grafana STAND-IN (NOT Grafana,
#    tests/images/grafana-standin) tagged grafana/grafana:12.1.1 and
#    kit-test/grafana-standin:latest.
# 5. For tls.mode acme: Debian's pebble (ACME test server + mock DNS) as kit-test/pebble:2.4, and
#    Debian's certbot as kit-test/certbot:2.1 tagged with every --certbot-tag (default
#    certbot/certbot:v3.1.0, the spec's default). Both come from a second root filesystem; the
#    certbot image trusts a test CA (made once, cached under $KIT_TEST_CACHE/acme-ca) that signs
#    pebble's HTTPS certificate for $ACME_TEST_ADDRESS and the name "pebble".
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
ACME_PACKAGES="pebble,certbot,ca-certificates"
ACME_TEST_ADDRESS="10.77.0.1" # where tests/e2e/test_acme.py puts pebble (tests/support/acme_ca.py)
STANDIN_PACKAGES="$PACKAGES,python3-uvloop,python3-yaml"

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
    sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

vllm_tags=()
nginx_tags=()
certbot_tags=()
serving_only=0
while [ $# -gt 0 ]; do
    case "$1" in
    --serving) serving_only=1; shift ;;
    --vllm-tag) [ $# -ge 2 ] || usage; vllm_tags+=("$2"); shift 2 ;;
    --nginx-tag) [ $# -ge 2 ] || usage; nginx_tags+=("$2"); shift 2 ;;
    --certbot-tag) [ $# -ge 2 ] || usage; certbot_tags+=("$2"); shift 2 ;;
    -h | --help) usage ;;
    *) echo "build.sh: unknown argument: $1" >&2; usage ;;
    esac
done
[ ${#vllm_tags[@]} -gt 0 ] || vllm_tags=("vllm/vllm-openai:v0.33.0")
[ ${#nginx_tags[@]} -gt 0 ] || nginx_tags=("nginx:1.27-alpine")
[ ${#certbot_tags[@]} -gt 0 ] || certbot_tags=("certbot/certbot:v3.1.0")
VLLM_IMAGE="kit-test/vllm-standin:latest"
NGINX_IMAGE="kit-test/nginx:1.26"
NGINX_OLDEST_IMAGE="kit-test/nginx:1.22"
# Debian 13's nginx (trixie has no nginx-light; its minimal root lacks passwd's groupadd).
NGINX_SUITE="trixie"
NGINX_PACKAGES="curl,ca-certificates,passwd,nginx,libnginx-mod-http-js"
PROMETHEUS_IMAGE="kit-test/prometheus:3"
GRAFANA_IMAGE="kit-test/grafana-standin:latest"
ALERTMANAGER_IMAGE="kit-test/alertmanager:0.33"
alertmanager_tags=("prom/alertmanager:v0.33.1")  # kit's pinned images.alertmanager
prometheus_tags=("prom/prometheus:v3.5.0")  # kit's pinned images.prometheus and images.grafana
grafana_tags=("grafana/grafana:12.1.1")
PEBBLE_IMAGE="kit-test/pebble:2.4"
CERTBOT_IMAGE="kit-test/certbot:2.1"

log() { echo "build.sh: $*" >&2; }

if ! docker info >/dev/null 2>&1; then
    log "no Docker engine answers; start one with scripts/dockerd.sh start"
    exit 1
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/build.lock"
flock 9 # one build at a time on this machine

# shellcheck source=tests/images/debian-mirror.sh
source "$HERE/debian-mirror.sh"

# rootfs_image NAME PACKAGES [HOOK]...: a Debian $SUITE (override per call: SUITE=trixie) root filesystem with PACKAGES imported
# as kit-test/NAME:<hash of the inputs>, its tarball cached; prints the image name.
rootfs_image() {
    local name="$1" packages="$2"
    shift 2
    local key tarball image
    key="$(printf '%s\n' "$SUITE" "$packages" "$@" | sha256sum | cut -c1-12)"
    image="kit-test/$name:$key"
    if docker image inspect "$image" >/dev/null 2>&1; then
        echo "$image"
        return
    fi
    tarball="$CACHE/$name-rootfs-$key.tar"
    [ "$name" != base ] || tarball="$CACHE/rootfs-$key.tar"
    if [ ! -s "$tarball" ]; then
        if ! command -v mmdebstrap >/dev/null; then
            log "installing mmdebstrap"
            DEBIAN_FRONTEND=noninteractive apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                mmdebstrap >/dev/null
        fi
        local hooks=() hook
        for hook in "$@"; do
            hooks+=(--customize-hook="$hook")
        done
        log "building the Debian $SUITE root filesystem of $name (about 30 s, once)"
        mmdebstrap --quiet --format=tar --variant=apt --include="$packages" \
            --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
            --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/doc/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' \
            "${hooks[@]}" \
            "$SUITE" "$tarball.part" "deb $(debian_mirror) $SUITE main" \
            >"$CACHE/mmdebstrap-$name.log" 2>&1 || {
            tail -n 30 "$CACHE/mmdebstrap-$name.log" >&2
            rm -f "$tarball.part"
            exit 1
        }
        mv "$tarball.part" "$tarball"
    fi
    log "importing $image"
    docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'ENV LANG=C.UTF-8' \
        "$tarball" "$image" >/dev/null
    # Images and root filesystems of earlier inputs are not needed any more.
    local old
    for old in "$(dirname "$tarball")/$(basename "$tarball" "$key.tar")"*.tar; do
        [ "$old" = "$tarball" ] || rm -f "$old"
    done
    docker image ls --format '{{.Repository}}:{{.Tag}}' "kit-test/$name" | while read -r old; do
        [ "$old" = "$image" ] || docker rmi "$old" >/dev/null
    done
    echo "$image"
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

BASE="$(rootfs_image base "$PACKAGES" "${CUSTOMIZE[@]}")"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Stand-in context: the stand-in's code (no tests' reference data) and the `vllm` command.
mkdir -p "$work/vllm/standin" "$work/vllm/bin"
cp "$REPO/tests/standin/vllm" "$REPO/tests/standin/README.md" \
    "$REPO/tests/standin/vllm-0.33.0-serve-flags.txt" "$work/vllm/standin/"
mkdir "$work/vllm/standin/vllm_standin"
cp "$REPO"/tests/standin/vllm_standin/*.py "$work/vllm/standin/vllm_standin/"
ln -s /opt/vllm-standin/vllm "$work/vllm/bin/vllm"
# huggingface_hub, as the real vLLM image carries it (pip-installed into its Python's
# dist-packages; vLLM downloads models with it): `kit pull` through a remote engine runs kit's
# fetcher (kit/dataplane/fetcher/weights_fetch.py) with the image's python3 and this library. The
# wheels of the version kit itself uses, for the image's Python (Debian bookworm: 3.11) and
# this machine, come from PyPI once and are cached; they are unpacked into the image's
# dist-packages, which is what pip's install of a wheel does.
HF_HUB_VERSION="2.4.0"
arch="$(uname -m)"
hf_wheels="$CACHE/huggingface-hub-$HF_HUB_VERSION-py311-$arch"
if [ ! -d "$hf_wheels" ]; then
    log "downloading huggingface_hub $HF_HUB_VERSION for the vLLM stand-in (once)"
    rm -rf "$hf_wheels.part"
    python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
        --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none \
        --platform "manylinux_2_28_$arch" --platform "manylinux_2_17_$arch" \
        --platform "manylinux2014_$arch" --dest "$hf_wheels.part" \
        "huggingface_hub==$HF_HUB_VERSION" >&2
    mv "$hf_wheels.part" "$hf_wheels"
fi
mkdir -p "$work/vllm/site-packages"
for wheel in "$hf_wheels"/*.whl; do
    python3 -m zipfile -e "$wheel" "$work/vllm/site-packages/"
done
STANDIN_BASE="$(rootfs_image standin-base "$STANDIN_PACKAGES" "${CUSTOMIZE[@]}")"
BASE="$STANDIN_BASE" build vllm-standin "$HERE/vllm-standin.Dockerfile" "$work/vllm" \
    "$VLLM_IMAGE" "${vllm_tags[@]}"

mkdir -p "$work/nginx"
cp "$HERE/nginx/nginx.conf" "$HERE/nginx/default.conf" "$work/nginx/"
NGINX_BASE="$(SUITE="$NGINX_SUITE" rootfs_image nginx-trixie "$NGINX_PACKAGES" "${CUSTOMIZE[@]}")"
build nginx-1.22 "$HERE/nginx.Dockerfile" "$work/nginx" "$NGINX_OLDEST_IMAGE"
BASE="$NGINX_BASE" build nginx "$HERE/nginx.Dockerfile" "$work/nginx" "$NGINX_IMAGE" \
    "${nginx_tags[@]}"

# Drop earlier builds of these images that lost their tags, then print what each tag names.
finish() {
    docker image prune --force --filter "label=kit.test.image" >/dev/null
    local tag
    for tag in "$@"; do
        docker image inspect --format "$tag {{.Id}} {{.Size}}" "$tag" |
            awk '{ printf "%-36s %.19s %4.0f MB\n", $1, $2, $3 / 1000000 }'
    done
}
if [ "$serving_only" = 1 ]; then
    finish "$VLLM_IMAGE" "${vllm_tags[@]}" "$NGINX_IMAGE" "${nginx_tags[@]}" "$NGINX_OLDEST_IMAGE"
    exit 0
fi

# Observability: Prometheus 3.5 (Debian's build) as the pinned Prometheus image, and a Grafana STAND-IN
# (NOT Grafana: no Debian package, no registry) as the pinned Grafana image.
mkdir -p "$work/prometheus" "$work/grafana"
prometheus_dir="$(bash "$HERE/prometheus.sh")"
cp "$prometheus_dir/usr/bin/prometheus" "$prometheus_dir/usr/bin/promtool" "$work/prometheus/"
build prometheus "$HERE/prometheus.Dockerfile" "$work/prometheus" "$PROMETHEUS_IMAGE" \
    "${prometheus_tags[@]}"
mkdir -p "$work/alertmanager"
alertmanager_dir="$(bash "$HERE/prometheus.sh" alertmanager)"
cp "$alertmanager_dir/usr/bin/prometheus-alertmanager" "$alertmanager_dir/usr/bin/amtool" \
    "$work/alertmanager/"
cp -r "$alertmanager_dir/usr/share/prometheus/alertmanager" "$work/alertmanager/share"
build alertmanager "$HERE/alertmanager.Dockerfile" "$work/alertmanager" "$ALERTMANAGER_IMAGE" \
    "${alertmanager_tags[@]}"
cp "$HERE/grafana-standin/grafana_standin.py" "$work/grafana/"
build grafana-standin "$HERE/grafana-standin.Dockerfile" "$work/grafana" "$GRAFANA_IMAGE" \
    "${grafana_tags[@]}"
# The test ACME server's HTTPS identity: made once, so the images' inputs stay the same.
acme_ca="$CACHE/acme-ca"
if [ ! -s "$acme_ca/server.crt" ]; then
    mkdir -p "$acme_ca.part"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
        -subj "/CN=kit test ACME server CA" -keyout "$acme_ca.part/ca.key" \
        -out "$acme_ca.part/ca.crt" 2>/dev/null
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=pebble" \
        -keyout "$acme_ca.part/server.key" -out "$acme_ca.part/server.csr" 2>/dev/null
    printf 'subjectAltName=DNS:pebble,IP:%s\n' "$ACME_TEST_ADDRESS" >"$acme_ca.part/san.ext"
    openssl x509 -req -in "$acme_ca.part/server.csr" -CA "$acme_ca.part/ca.crt" \
        -CAkey "$acme_ca.part/ca.key" -CAcreateserial -days 3650 \
        -extfile "$acme_ca.part/san.ext" -out "$acme_ca.part/server.crt" 2>/dev/null
    rm -rf "$acme_ca" && mv "$acme_ca.part" "$acme_ca"
fi
ACME_BASE="$(rootfs_image acme "$ACME_PACKAGES")"
mkdir -p "$work/pebble" "$work/certbot"
cp "$acme_ca/server.crt" "$acme_ca/server.key" "$HERE"/pebble/* "$work/pebble/"
cp "$acme_ca/ca.crt" "$work/certbot/acme-ca.crt"
BASE="$ACME_BASE" build pebble "$HERE/pebble.Dockerfile" "$work/pebble" "$PEBBLE_IMAGE"
BASE="$ACME_BASE" build certbot "$HERE/certbot.Dockerfile" "$work/certbot" "$CERTBOT_IMAGE" \
    "${certbot_tags[@]}"

finish "$VLLM_IMAGE" "${vllm_tags[@]}" "$NGINX_IMAGE" "${nginx_tags[@]}" "$NGINX_OLDEST_IMAGE" \
    "$PROMETHEUS_IMAGE" "${prometheus_tags[@]}" "$ALERTMANAGER_IMAGE" "${alertmanager_tags[@]}" \
    "$GRAFANA_IMAGE" "${grafana_tags[@]}" \
    "$PEBBLE_IMAGE" "$CERTBOT_IMAGE" "${certbot_tags[@]}"
