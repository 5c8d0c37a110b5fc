#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine (the README's test command; CI runs it).
# Installs what the tests need (Debian packages, Python deps), starts a Docker engine when none
# answers (and stops only that one), builds the local test images, then runs unit + e2e tests.
# An engine that already answers (started by someone else) must give containers GPUs: the NVIDIA
# runtime, or the hook stub of `scripts/dockerd.sh hook` on its dockerd's PATH; the e2e tests check
# it once and name the fix. Engines the tests start themselves get the stub from dockerd.sh.
#   scripts/test.sh            everything
#   scripts/test.sh -m 'not e2e'   without the engine-backed tests (any pytest arguments work)
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
# No host nginx: the unit tests' `nginx -t` runs Debian 13's nginx + njs from the root filesystem
# tests/images/build.sh caches (tests/support/nginx_ns.py, docs/compatibility.md).
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v curl >/dev/null || missing+=(curl)
command -v openssl >/dev/null || missing+=(openssl)   # build.sh: the test ACME server's CA
command -v ip >/dev/null || missing+=(iproute2)        # tests/support/acme_ca.py: pebble's address
if [ ${#missing[@]} -gt 0 ]; then
  echo "test.sh: installing ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi
# The host nginx may have been started by its package: the tests start their own.
systemctl disable --now nginx >/dev/null 2>&1 || service nginx stop >/dev/null 2>&1 || true

python3 -m pip install -q --disable-pip-version-check -e '.[test]'

# Lint first: a finding fails the run before any engine work (ruff is in the test extra).
python3 -m ruff check kit tests scripts
# Type check kit (pyproject.toml [tool.mypy]): a finding fails the run too (mypy is in the extra).
python3 -m mypy

if docker info >/dev/null 2>&1; then
  scripts/dockerd.sh start            # only checks; an engine already answers: never stopped here
else
  scripts/dockerd.sh start
  trap 'scripts/dockerd.sh stop' EXIT # stop only the engine this run started
fi
tests/images/build.sh

# --durations: every run prints its slowest tests, so the 35-minute budget is watched where it goes.
python3 -m pytest -ra --durations=30 "$@"
