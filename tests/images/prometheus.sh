#!/usr/bin/env bash
# Prometheus 3 for the tests: Debian forky's `prometheus` and `promtool` packages (3.5.x, the
# LTS line of the pinned prom/prometheus:v3.5.0) unpacked (not installed: no service starts on
# this host) into $KIT_TEST_CACHE/prometheus-<version>/; prints that folder. Its usr/bin/prometheus
# and usr/bin/promtool go into the Prometheus test image (build.sh) and run the unit tests'
# `promtool check config` / `promtool check rules`, so both run the same build.
#
# Why Debian's build and not `go install github.com/prometheus/prometheus/cmd/...@v0.305.0`: the
# Go module proxy is not reachable from the machines kit is tested on (only PyPI, Debian and npm
# are). Debian's binaries are Prometheus's own code built by Debian's Go (linked to glibc >= 2.34,
# so they run on this Debian 12 host and in the bookworm test image); they carry no web UI
# (Debian's "+ds" source drops the UI assets), which no test uses: the tests speak /api/v1/*.
#
# forky's package index lives in a private apt state under the cache (the host's apt sources stay
# bookworm's); it is fetched once, and again only when the version it names is gone from the mirror.
#
#   tests/images/prometheus.sh [alertmanager]
#
# With `alertmanager`: Debian forky's prometheus-alertmanager package (0.33.x, kit pins
# prom/alertmanager:v0.33.1) unpacked the same way into $KIT_TEST_CACHE/alertmanager-<version>/:
# usr/bin/prometheus-alertmanager for the test image, usr/bin/amtool for the unit tests.
set -euo pipefail
CACHE="${KIT_TEST_CACHE:-/var/cache/kit-test}"
SUITE="forky"
case "${1:-prometheus}" in
prometheus)
    NAME="prometheus" PACKAGES=(prometheus promtool) BINARIES=(promtool prometheus)
    MAJOR="3." ;; # kit pins prom/prometheus:v3.5.0; a Debian on 4.x must be looked at first
alertmanager)
    NAME="alertmanager" PACKAGES=(prometheus-alertmanager) BINARIES=(amtool prometheus-alertmanager)
    MAJOR="0.33." ;; # kit pins prom/alertmanager:v0.33.1
*) echo "prometheus.sh: unknown component: $1 (prometheus or alertmanager)" >&2; exit 2 ;;
esac
mkdir -p "$CACHE"
exec 8>"$CACHE/prometheus.lock"
flock 8 # build.sh and the unit tests' fixture may both ask at once

# shellcheck source=tests/images/debian-mirror.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian-mirror.sh"

apt_root="$CACHE/apt-$SUITE"
apt_options=(
    -o "Dir=$apt_root" -o "Dir::State::status=$apt_root/status"
    -o "Dir::Etc::sourcelist=$apt_root/sources.list" -o "Dir::Etc::sourceparts=$apt_root/none"
    -o "Dir::Etc::preferencesparts=$apt_root/none" -o "APT::Architecture=$(dpkg --print-architecture)"
    -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root"
)
refresh_index() {
    mkdir -p "$apt_root/var/lib/apt/lists/partial" "$apt_root/var/cache/apt/archives/partial" \
        "$apt_root/none"
    : >"$apt_root/status"
    printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n' \
        "$(debian_mirror)" "$SUITE" >"$apt_root/sources.list"
    apt-get "${apt_options[@]}" update -qq >&2
}
candidate() {
    apt-cache "${apt_options[@]}" policy "${PACKAGES[0]}" 2>/dev/null | awk '/Candidate:/ { print $2 }'
}

check_major() {
    case "$version" in
    "$MAJOR"*) ;;
    *) echo "prometheus.sh: Debian $SUITE has ${PACKAGES[0]} '$version', not $MAJOR*" >&2; exit 1 ;;
    esac
}

[ -s "$apt_root/sources.list" ] || refresh_index
version="$(candidate)"
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
    refresh_index
    version="$(candidate)"
fi
dir="$CACHE/$NAME-${version//[:+~]/_}"
if [ ! -x "$dir/usr/bin/${BINARIES[0]}" ] || [ ! -x "$dir/usr/bin/${BINARIES[1]}" ]; then
    check_major
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    download() {
        (cd "$work" && apt-get "${apt_options[@]}" download -qq \
            "${PACKAGES[@]/%/=$version}" >&2)
    }
    if ! download; then
        # The mirror keeps only a suite's current version: take the one it names now.
        refresh_index
        version="$(candidate)"
        dir="$CACHE/$NAME-${version//[:+~]/_}"
        check_major
        download
    fi
    rm -rf "$dir.part"
    for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$dir.part"; done
    "$dir.part/usr/bin/${BINARIES[0]}" --version >/dev/null # runs on this host (glibc) or says why not
    rm -rf "$dir"
    mv "$dir.part" "$dir"
fi
echo "$dir"
