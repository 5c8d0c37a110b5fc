"""One writer per site, on a real engine: while `kit up` rolls a two-replica service under load,
a second `kit up` started 1 s later waits for it (then finds nothing to do), one with
--wait-lock 0 refuses naming the holder, and so does `kit up` of a copied folder (same site
name, same engine: the same stack). No request under load fails."""

import secrets
import shutil
import subprocess
import sys
import threading
import time

import pytest
import yaml

from tests.support.docker_engine import pick_free_port, remove_project
from tests.support.live_stack import SERVICE, LiveSite, finished, write_spec

pytestmark = pytest.mark.e2e


def start_kit(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kit", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_second_kit_up_during_a_rollout_waits_or_refuses_naming_the_first(
        tmp_path, docker_client, test_images):
    site = LiveSite.create(
        tmp_path / "site", docker_client, pick_free_port(), pick_free_port(), prefix="lock",
        proxy={"rate_limit_per_ip": 100000, "rate_limit_per_credential": 100000},
        overrides={SERVICE: {"gpus": [0, 1], "tensor_parallel": 1,
                             "gpu_memory_utilization": 0.9}})
    try:
        site.up()
        copy = tmp_path / "copy"  # a copied folder: same `site:`, no `engine:` → same stack
        copy.mkdir()
        shutil.copy(site.spec_path, copy / "site.yaml")
        key = site.add_key(f"lock-{secrets.token_hex(2)}")
        spec = yaml.safe_load(site.spec_path.read_text())
        spec["services"][0]["max_num_seqs"] = 200  # a pending rolling update of both replicas
        write_spec(site.spec_path, spec)
        batches: list[dict] = []
        done = threading.Event()

        def load() -> None:
            while not done.is_set():
                batches.append(finished(site.loadgen(f"Bearer {key}", streams=16, tokens=40)))

        loading = threading.Thread(target=load)
        loading.start()
        try:
            time.sleep(2)
            first = start_kit("up", str(site.spec_path))
            time.sleep(1)
            second = start_kit("up", str(site.spec_path), "--wait-lock", "600")
            time.sleep(1)
            refused = start_kit("up", str(site.spec_path), "--wait-lock", "0")
            copied = start_kit("up", str(copy / "site.yaml"), "--wait-lock", "0")
            outputs = {name: process.communicate(timeout=900) for name, process in
                       [("first", first), ("refused", refused), ("copied", copied),
                        ("second", second)]}
            time.sleep(2)
        finally:
            done.set()
            loading.join(timeout=120)
        codes = {"first": first.returncode, "second": second.returncode,
                 "refused": refused.returncode, "copied": copied.returncode}
        requests = sum(b["requests"] for b in batches)
        failed = {k: v for b in batches for k, v in b["failures"].items()}
        print(f"exit codes {codes}; {requests} requests in {len(batches)} batches of 16 streams, "
              f"failed {failed}")
        out, err = outputs["first"]
        assert codes["first"] == 0, out + err
        assert out.count("back in nginx") == 2, out
        holder = f"in use by `kit up` (pid {first.pid} on "
        out, err = outputs["second"]
        assert codes["second"] == 0, out + err
        assert holder in err and "waiting up to 600 s" in err, err
        assert "no change" in out, out  # it ran after the first, on the stack the first left
        for name in ("refused", "copied"):
            out, err = outputs[name]
            assert codes[name] == 1, (name, out, err)
            assert holder in err and "--wait-lock SECONDS" in err, (name, err)
            assert "roll" not in out, (name, out)  # it did nothing
        assert f"stack {site.name} on " in outputs["copied"][1]
        assert failed == {} and requests >= 16 * 3, batches
        assert " down;" not in site.layout.replica_pool(SERVICE).read_text()
    finally:
        remove_project(docker_client, site.name)
