#!/usr/bin/env python3
"""How fast kit verifies a pinned model's files against the lock file on this machine.

Writes a model-like file set (default 2 GB: shards of 512 MB plus small files) into a temp
folder, locks it, then measures in one run, interleaved over N rounds, median:
  - one thread hashing every file (hashlib's sha256, the floor);
  - `check_folder` with no hash cache (kit's parallel hashing: what the first `kit up` after
    a copy costs);
  - `check_folder` with the cache `kit pull` / the first check left (what every re-up costs).
Files are read from the page cache (the machine has the RAM and the script does not drop it:
that would disturb everything else running here); a cold read from disk is bounded by the
disk instead, whichever is slower. Prints GB/s and the ratio of each to the floor.

    python3 scripts/bench_weights.py [--gb 2] [--rounds 3]
"""

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kit.weights.lock import LockedFile, LockedModel  # noqa: E402
from kit.weights.verify import HashCache, check_folder, file_sha256, hash_workers  # noqa: E402

SHARD = 512 << 20


def make_files(folder: Path, total: int) -> LockedModel:
    files = []
    block = hashlib.shake_256(b"kit-bench").digest(8 << 20)
    count = max(1, total // SHARD)
    for n in range(count):
        path = folder / f"model-{n + 1:05d}-of-{count:05d}.safetensors"
        with path.open("wb") as out:
            for _ in range(SHARD // len(block)):
                out.write(block)
        files.append(path)
    for name in ("config.json", "tokenizer.json", "model.safetensors.index.json"):
        (folder / name).write_bytes(b"{}\n" * 100)
        files.append(folder / name)
    return LockedModel("bench/model", "main", "0" * 40, tuple(
        LockedFile(p.name, p.stat().st_size, file_sha256(p)) for p in files))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kit-bench-weights-") as scratch:
        folder = Path(scratch) / "model"
        folder.mkdir()
        locked = make_files(folder, int(args.gb * (1 << 30)))
        size = locked.total_bytes
        cache_file = Path(scratch) / "weights-hashes.json"
        times: dict[str, list[float]] = {"one thread": [], "kit, no cache": [],
                                         "kit, cached (re-up)": []}
        for _ in range(args.rounds):
            started = time.perf_counter()
            for f in locked.files:
                file_sha256(folder / f.path)
            times["one thread"].append(time.perf_counter() - started)
            cache_file.unlink(missing_ok=True)
            started = time.perf_counter()
            assert check_folder(folder, locked, HashCache(cache_file)) == []
            times["kit, no cache"].append(time.perf_counter() - started)
            started = time.perf_counter()
            assert check_folder(folder, locked, HashCache(cache_file)) == []
            times["kit, cached (re-up)"].append(time.perf_counter() - started)
        floor = statistics.median(times["one thread"])
        print(f"{size / 1e9:.2f} GB in {len(locked.files)} files, {os.cpu_count()} CPUs, "
              f"{hash_workers()} hashing threads, median of {args.rounds} rounds")
        for name, values in times.items():
            seconds = statistics.median(values)
            rate = "(stat only)" if "cached" in name else f"{size / 1e9 / seconds:.2f} GB/s"
            print(f"  {name:<20} {seconds:8.3f} s  {rate:>12}  x{floor / seconds:.2f} vs one "
                  "thread")


if __name__ == "__main__":
    main()
