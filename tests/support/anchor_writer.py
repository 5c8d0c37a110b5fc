"""Another `kit audit verify` keeping its head as an anchor at the same moment (kit/usage/audit.py
`keep_anchor`), for the test that two runs never lose one.

`python -m tests.support.anchor_writer ANCHORS SEQ GO` prints `ready`, waits for the file GO,
then keeps head SEQ and prints `kept` (or `not kept`). It reads the anchors slowly (`DELAY`
seconds between the read and the write), so two writers without the file's lock would both
read before either writes.
"""

import subprocess
import sys
import time
from pathlib import Path

from kit.usage import audit
from tests.support.sites import REPO

DELAY = 0.5


def start_anchor_writer(anchors: Path, seq: int, go: Path) -> subprocess.Popen:
    """A process ready to keep head `seq` in `anchors` once `go` exists."""
    writer = subprocess.Popen([sys.executable, "-m", "tests.support.anchor_writer", str(anchors),
                               str(seq), str(go)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
    return writer


def main(args: list[str]) -> None:
    anchors, seq, go = Path(args[0]), int(args[1]), Path(args[2])
    read = audit.read_anchors

    def slow_read(path: Path) -> list[audit.ChainHead]:
        found = read(path)
        time.sleep(DELAY)
        return found

    audit.read_anchors = slow_read
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.01)
    head = audit.ChainHead(seq, f"{seq:064x}", f"2026-12-01T12:00:{seq:02d}+00:00")
    print("kept" if audit.keep_anchor(anchors, head) else "not kept", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
