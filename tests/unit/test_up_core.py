"""kit up's core against the fake engine: render, converge from nothing, converge again (no-op)."""

from pathlib import Path

from kit.site import Site
from kit.up import up_site
from tests.support.fake_engine import FakeEngine
from tests.unit.test_desired import write_site


class HealthyEngine(FakeEngine):
    """Every container with a healthcheck reports healthy as soon as it starts."""

    def start(self, container_id: str) -> None:
        super().start(container_id)
        if self.inspect(container_id)["State"].get("Health"):
            self.set_health(container_id, "healthy")


def test_up_renders_converges_and_an_unchanged_site_is_a_no_op(tmp_path: Path) -> None:
    site = Site.load(write_site(tmp_path))
    reported: list[str] = []
    engine = HealthyEngine(local=False)  # a remote engine: no host bind or port checks here
    for image in ("vllm/vllm-openai:v0.33.0", "nginx:1.27-alpine"):
        engine.images[image] = f"sha256:{len(engine.images)}"
    first = up_site(site, timeout=5, probe=False, report=reported.append,
                    warn=reported.append, connect=lambda: engine)
    assert first.probe is None
    assert "change(s) applied" in first.summary()
    assert set(engine.names()) == {f"unit01-{s.name}-1" for s in site.desired.services}
    assert any(line.startswith("created compose/docker-compose.yml") for line in reported)
    again = up_site(Site.load(site.spec_path), timeout=5, probe=False, report=reported.append,
                    warn=reported.append, connect=lambda: engine)
    assert again.converged.actions == [] and again.summary().startswith("no change")
