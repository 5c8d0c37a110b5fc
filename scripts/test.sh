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
# tests/support/nginx_ns.py shifted_clock: a door whose minute ends in seconds, not a minute
compgen -G '/usr/lib/*/faketime/libfaketime.so.1' >/dev/null || missing+=(libfaketime)
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

cleanup=()
finish() { for step in "${cleanup[@]}"; do eval "$step" || true; done; }
trap finish EXIT
if docker info >/dev/null 2>&1; then
  scripts/dockerd.sh start            # only checks; an engine already answers: never stopped here
else
  scripts/dockerd.sh start
  cleanup+=('scripts/dockerd.sh stop') # stop only the engine this run started
fi
tests/images/build.sh

# The tests' temporary folders on a tmpfs when this run can mount one (root): kit fsyncs every
# file it writes (atomic writes) and the suite renders thousands of sites; on a VM's disk each
# fsync waits ~1.4 ms (test_site_files_faults: 54 s on the disk, 24 s here). The one test about
# the disk's own behaviour (ext4 handing an inode number out again) makes its folder on /var/tmp.
basetemp="${KIT_TEST_TMPFS:-/tmp/kit-tests-tmpfs}"
temp=()
if [ "$(id -u)" = 0 ] && mkdir -p "$basetemp" && { mountpoint -q "$basetemp" ||
     { mount -t tmpfs -o size=8g kit-tests "$basetemp" && cleanup+=("umount -l '$basetemp'"); }; }
then
  temp=(--basetemp "$basetemp/pytest")
else
  echo "test.sh: no tmpfs for the tests' folders (not root?): they stay on the disk, slower"
fi

# Two passes (docs/testing.md). First the tests marked `serial` (they measure time or performance
# ratios that other tests' load would distort; docs/testing.md lists them), alone on the machine.
# Then every other test in $KIT_TEST_WORKERS (3) pytest-xdist workers at once: the e2e tests
# mostly wait (verdict windows, ACME retries, soaks, stacks coming up), and the workers fill
# those waits with other modules and the CPU-bound unit tests. Each e2e
# module runs on one worker, in order (`--dist loadgroup`, tests/conftest.py); what tests running
# at once could share on the one engine is per worker (tests/support/docker_engine.py).
# --durations: every run prints its slowest tests, so the 25-minute budget is watched where it goes.
workers="${KIT_TEST_WORKERS:-3}"  # 3 on 2 cores: waits fill a third worker (docs/testing.md)
took() { echo "$(( (SECONDS - $1) / 60 )) min $(( (SECONDS - $1) % 60 )) s"; }
started=$SECONDS
rc_serial=0
python3 -m pytest -ra --durations=5 --serial-tests only "${temp[@]}" "$@" || rc_serial=$?
serial_took="$(took "$started")"
started=$SECONDS
rc_parallel=0
python3 -m pytest -ra --durations=30 -n "$workers" --dist loadgroup --serial-tests skip "${temp[@]}" "$@" ||
  rc_parallel=$?
echo "test.sh: serial pass exit $rc_serial in $serial_took;" \
  "parallel pass ($workers workers) exit $rc_parallel in $(took "$started")"
# 5 is pytest's "no test selected": fine for one pass (arguments may select only the other's).
if [ "$rc_serial" = 5 ] && [ "$rc_parallel" = 5 ]; then exit 5; fi
for rc in "$rc_serial" "$rc_parallel"; do
  [ "$rc" = 0 ] || [ "$rc" = 5 ] || exit "$rc"
done
