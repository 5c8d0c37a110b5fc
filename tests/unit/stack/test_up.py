"""kit up's core against the fake engine: render, converge from nothing, converge again (no-op)."""

from pathlib import Path

import pytest

from kit.engine.desired import NetworkState
from kit.errors import KitError
from kit.plan.observability import metrics_network
from kit.site import Site
from kit.stack.up import START_LOG_SLACK_S, up_site
from tests.support.fake_engine import engine_with_images
from tests.support.sites import write_site


def test_up_renders_converges_and_an_unchanged_site_is_a_no_op(tmp_path: Path) -> None:
    site = Site.load(write_site(tmp_path))
    reported: list[str] = []
    engine = engine_with_images()  # a remote engine: no host bind or port checks here
    first = up_site(site, timeout=5, probe=False, report=reported.append,
                    warn=reported.append, connect=lambda: engine)
    assert first.probe is None
    assert "change(s) applied" in first.summary()
    assert set(engine.names()) == {f"unit01-{s.name}-1" for s in site.desired.services}
    assert any(line.startswith("created compose/docker-compose.yml") for line in reported)
    again = up_site(Site.load(site.spec_path), timeout=5, probe=False, report=reported.append,
                    warn=reported.append, connect=lambda: engine)
    assert again.converged.actions == [] and again.summary().startswith("no change")


NOFILE_ALERT = "2026/11/30 22:00:00 [alert] 29#29: setrlimit(RLIMIT_NOFILE, 32768) failed " \
               "(1: Operation not permitted)"


def test_a_front_door_that_cannot_take_its_open_files_limit_fails_up(tmp_path: Path) -> None:
    """At start and at a reload nginx's workers set worker_rlimit_nofile; above the engine's
    hard limit they log an alert and keep serving with far fewer connections: kit up names it."""
    site = Site.load(write_site(tmp_path))
    engine = engine_with_images()
    engine.worker_log.append(NOFILE_ALERT)
    with pytest.raises(KitError) as at_start:
        up_site(site, timeout=5, probe=False, report=lambda _: None, warn=lambda _: None,
                connect=lambda: engine)
    assert "cannot open the connections the site's streams need" in at_start.value.message
    assert NOFILE_ALERT in at_start.value.message and "default-ulimits" in str(at_start.value.fix)
    engine.worker_log.clear()
    seqs = site.spec_path.read_text()
    site.spec_path.write_text(seqs.replace("max_num_seqs: 8", "max_num_seqs: 16"))
    reloaded = up_site(Site.load(site.spec_path), timeout=5, probe=False,
                       report=lambda _: None, warn=lambda _: None, connect=lambda: engine)
    assert any(str(a).startswith("reload ") for a in reloaded.converged.actions)  # and passes:
    # the alert of the first start is not read again
    engine.worker_log.append(NOFILE_ALERT)
    site.spec_path.write_text(seqs.replace("max_num_seqs: 8", "max_num_seqs: 32"))
    with pytest.raises(KitError) as at_reload:
        up_site(Site.load(site.spec_path), timeout=5, probe=False, report=lambda _: None,
                warn=lambda _: None, connect=lambda: engine)
    assert NOFILE_ALERT in at_reload.value.message


def test_an_alert_stamped_just_before_the_recorded_start_is_still_read(tmp_path: Path) -> None:
    """dockerd may stamp a container's first log lines a little before the StartedAt it
    records (seen on CI: kit up passed over the alert): the start's lines are read from a
    moment before it."""
    site = Site.load(write_site(tmp_path))
    engine = engine_with_images()
    engine.worker_log.append(NOFILE_ALERT)
    engine.start_log_skew = START_LOG_SLACK_S / 2
    with pytest.raises(KitError) as at_start:
        up_site(site, timeout=5, probe=False, report=lambda _: None, warn=lambda _: None,
                connect=lambda: engine)
    assert NOFILE_ALERT in at_start.value.message


def test_a_metrics_subnet_the_engine_already_uses_is_refused_before_any_change(
        tmp_path: Path) -> None:
    """Another network of the engine holds the metrics network's subnet: kit up says which
    and how to choose another, having created nothing (the engine would refuse it midway)."""
    site = Site.load(write_site(tmp_path))
    engine = engine_with_images()
    subnet = metrics_network("unit01", None).subnet  # the metrics network's, by default
    engine.create_network(NetworkState("other", "someone_else", False, {}, subnet=subnet))
    before = len(engine.calls)
    with pytest.raises(KitError) as refused:
        up_site(site, timeout=5, probe=False, report=lambda _: None, warn=lambda _: None,
                connect=lambda: engine)
    assert f"overlaps {subnet} of network someone_else" in refused.value.message
    assert "observability.subnet" in str(refused.value.fix)
    assert not [call for call in engine.calls[before:] if call[0].startswith("create")]
