"""kit status lists the LoRA adapters each replica serves (its own /v1/models, asked inside its
container) and names the drift from the spec, on the fake engine."""

import json
from datetime import UTC, datetime
from pathlib import Path

from kit.site import Site
from kit.stack.up import up_site
from kit.views.status import gather, render_text
from tests.support.adapters import write_adapter
from tests.support.fake_engine import ReplicaEngine
from tests.support.sites import write_site


def models_answer(*adapters: str) -> tuple[int, str]:
    """curl's output for a replica's /v1/models: the base, then its adapters (vLLM's cards)."""
    cards = [{"id": "beta", "parent": None}] + [{"id": name, "parent": "beta"}
                                                for name in adapters]
    return 0, json.dumps({"object": "list", "data": cards}) + "\n200"


def test_status_shows_each_replicas_adapters_and_the_drift(tmp_path: Path) -> None:
    spec = write_site(tmp_path)
    for name in ("support", "legal"):
        write_adapter(tmp_path / "models" / name, base="qwen", rank=8)
    spec.write_text(spec.read_text().replace(
        "    gpus: [1, 2]\n", "    gpus: [1, 2]\n    replicas: 2\n    adapters: "
        "[{name: support, path: support}, {name: legal, path: legal}]\n"))
    engine = ReplicaEngine({"unit01-beta-r0-1": models_answer("legal", "support"),
                            "unit01-beta-r1-1": models_answer("support", "stray")})
    site = Site.load(spec)
    up_site(site, timeout=5, probe=False, report=lambda _: None, warn=lambda _: None,
            connect=lambda: engine)
    status = gather(Site.load(spec), engine)
    now = datetime.now(UTC)
    text = render_text(status, now)
    assert "adapters of beta-r0: legal, support\n" in text + "\n"
    assert ("adapters of beta-r1: stray, support; DRIFT: declared but not loaded: legal; "
            "DRIFT: loaded but not declared: stray") in text
    assert status.to_json(now)["adapters"] == [
        {"container": "beta-r0", "served": ["legal", "support"], "missing": [],
         "undeclared": []},
        {"container": "beta-r1", "served": ["stray", "support"], "missing": ["legal"],
         "undeclared": ["stray"]}]
    assert not any("alpha" in replica.container for replica in status.adapters)
