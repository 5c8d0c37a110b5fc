#!/usr/bin/env bash
# Debian's `prometheus` package unpacked (not installed: no service starts on this host) into
# $KIT_TEST_CACHE/prometheus-<version>/; prints that folder. Its usr/bin/prometheus and
# usr/bin/promtool go into the Prometheus test image (build.sh) and run the unit tests'
# `promtool check config` / `promtool check rules`.
set -euo pipefail
CACHE="${KIT_TEST_CACHE:-/var/cache/kit-test}"
mkdir -p "$CACHE"
version="$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ { print $2 }')"
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    version="$(apt-cache policy prometheus | awk '/Candidate:/ { print $2 }')"
fi
dir="$CACHE/prometheus-${version//[:+~]/_}"
if [ ! -x "$dir/usr/bin/promtool" ]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    (cd "$work" && apt-get download -qq "prometheus=$version" 2>/dev/null)
    rm -rf "$dir.part"
    dpkg-deb -x "$work"/prometheus_*.deb "$dir.part"
    mv "$dir.part" "$dir"
fi
echo "$dir"
