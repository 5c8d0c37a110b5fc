"""Another kit process holding a site lock (kit/site_lock.py), for the tests of who waits.

`python -m tests.support.lock_holder ROOT VERB SECONDS [ENGINE SITE]` takes the lock as that
verb would, prints `held` once it has it, and holds it SECONDS (or until killed).
"""

import subprocess
import sys
import time
from pathlib import Path

from kit.site_lock import site_lock
from tests.support.sites import REPO


def start_holder(root: Path, verb: str, seconds: float,
                 stack: tuple[str, str] | None = None) -> subprocess.Popen:
    """A process holding the lock of `root` (and `stack`) once this returns."""
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.support.lock_holder", str(root), verb, str(seconds),
         *(stack or ())], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def main(args: list[str]) -> None:
    root, verb, seconds, *stack = args
    with site_lock(Path(root), verb, stack=(stack[0], stack[1]) if stack else None, wait=0):
        print("held", flush=True)
        time.sleep(float(seconds))


if __name__ == "__main__":
    main(sys.argv[1:])
