"""The base site's service cut into four replicas behind the rendered door (door_ns.py), each
replica a stand-in on its own loopback address: for prefix routing's door tests and its
benchmark (scripts/bench_prefix_routing.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kit.render.site_files import render_site
from kit.site import Site
from tests.support.cli import run_kit
from tests.support.door_ns import Door, serving_door
from tests.support.sites import base_site

SERVED = "llama-3.1-8b"
HOST = "llm.test.internal"
REPLICAS = {f"llama8b-r{i}": f"127.0.1.{i + 1}" for i in range(4)}


@contextmanager
def replica_door(root: Path, routing: str, **standin: str) -> Iterator[tuple[Door, str, Path]]:
    """A door whose service has the four REPLICAS routed by `routing` (a YAML flow mapping),
    each stand-in started with `standin`; yields (door, a Bearer key, the nginx folder)."""
    site = base_site(root)
    spec = site / "site.yaml"
    spec.write_text(spec.read_text().replace("    gpus: [0]\n", (
        f"    gpus: [0, 1, 2, 3]\n    tensor_parallel: 1\n    routing: {routing}\n")))
    render_site(Site.load(spec))
    added = run_kit("keys", "add", spec, "client", "--offline")
    assert added.exit_code == 0, added.output
    (root / "work").mkdir()
    with serving_door(site / "nginx", root / "work", ["llama8b", *REPLICAS],
                      root / "models" / "llama-8b", SERVED, HOST, replicas=REPLICAS,
                      **standin) as running:
        yield running, added.output.split("key client: ")[1].split()[0], site / "nginx"
