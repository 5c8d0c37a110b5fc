"""kit/site.py: a verb loads its site once; the rendered compose file is read only when needed."""

from pathlib import Path

import pytest

from kit.errors import KitError
from kit.site import Site
from kit.spec import load as spec_module
from tests.support.sites import write_site


def test_the_desired_state_is_read_on_first_use_and_kept(tmp_path: Path) -> None:
    spec = write_site(tmp_path)
    site = Site.load(spec)  # nothing rendered yet: loading the site must not need the compose file
    with pytest.raises(KitError, match="does not exist"):
        _ = site.desired
    from kit.render.site_files import render_site

    render_site(site)
    assert site.desired is site.desired  # parsed once
    assert {s.name for s in site.desired.services} >= {"nginx"}


def test_a_render_and_a_dry_run_parse_the_spec_once(tmp_path: Path, monkeypatch) -> None:
    spec = write_site(tmp_path)
    loads = []
    real = spec_module.parse_spec  # every spec load, from any module, ends here
    monkeypatch.setattr(spec_module, "parse_spec", lambda *a, **k: loads.append(a) or real(*a, **k))
    from kit.render.site_files import render_site

    site = Site.load(spec)
    render_site(site)
    render_site(site, dry_run=True)
    assert len(loads) == 1
