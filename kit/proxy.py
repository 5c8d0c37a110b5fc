"""The running front door: reload it in place after a credential change, and prove logins.

A reload is nginx's graceful one: `nginx -t` in the container first, then SIGHUP. New workers
take new connections with the new credentials; old workers finish the streams they carry, so
no stream is dropped.
"""

from kit.docker_api import connect
from kit.errors import KitError
from kit.layout import SiteLayout
from kit.observe import ProxyLoaded, write_proxy_loaded
from kit.probe import Gate, probe_password, target_for
from kit.spec import Spec
from kit.stack import SERVICE_LABEL, load_desired, project_filter

PROXY_SERVICE = "nginx"


class EngineUnreachable(KitError):
    """No Docker engine answered: there is no running proxy kit can reach to reload."""


def reload_proxy(spec: Spec, layout: SiteLayout) -> str | None:
    """Reload the site's running nginx; its container name, or None when none is running."""
    proxy = load_desired(layout, spec.site).service(PROXY_SERVICE)
    try:
        engine = connect()
    except KitError as error:
        raise EngineUnreachable(error.message, fix=error.fix) from None
    labels = [*project_filter(spec.site), f"{SERVICE_LABEL}={PROXY_SERVICE}"]
    running = [c for c in engine.containers(labels) if c.get("State", {}).get("Running")]
    if not running:
        return None
    container = running[0]
    code, output = engine.exec(container["Id"], [*proxy.config.command, "-t"])
    if code != 0:
        raise KitError(
            f"nginx rejected the new files and keeps serving the old ones:\n{output.rstrip()}",
            fix="the credential files were restored; report this output",
        )
    engine.signal(container["Id"], "SIGHUP")
    if proxy.site_files_digest is not None:
        write_proxy_loaded(layout.applied, ProxyLoaded(container["Id"], proxy.site_files_digest))
    return container["Name"].lstrip("/")


def login_status(spec: Spec, layout: SiteLayout, authorization: str) -> int:
    """The HTTP status the front door gives `GET /v1/models` with this Authorization header."""
    gate = Gate(target_for(spec, layout, None, timeout=10), probe_password(layout))
    return gate.fetch("GET", "/v1/models", credentials=authorization).status
