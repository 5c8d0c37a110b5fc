"""`kit pull`'s one entry: where a site's pinned models are downloaded. A local engine's models
are pulled on this host (kit/weights/pull.py); a remote engine's host downloads them itself,
never through this machine (kit/supply/remote_pull.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from kit.engine.docker_api import connect
from kit.engine.url import is_local
from kit.supply.remote_pull import pull_site_remote
from kit.weights.pull import pull_site

if TYPE_CHECKING:
    from kit.site import Site
    from kit.weights.pull import PullResult


def pull_models(site: Site, service: str | None, out: TextIO) -> list[PullResult]:
    """The pinned models of the site (or of one service), pulled where its engine runs and
    verified against site.lock; the progress goes to `out`."""
    if is_local(site.engine_url):
        return pull_site(site.spec, site.layout, service, out)
    return pull_site_remote(connect(site.engine_url), site.spec, site.layout, service, out)
