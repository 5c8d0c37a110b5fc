"""The running front door: reload it in place after a credential change, and prove logins.

The reload is kit up's own (kit/apply.py): `nginx -t` in the container, SIGHUP, and a check
that new workers took over. Old workers finish the streams they carry, so none is dropped.
"""

from kit.apply import Executor
from kit.docker_api import connect
from kit.errors import KitError
from kit.layout import SiteLayout
from kit.observe import container_state
from kit.probe import Gate, probe_password, target_for
from kit.reconcile import ReloadProxy
from kit.spec import Spec
from kit.stack import PROXY_SERVICE, SERVICE_LABEL, load_desired, project_filter


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
    running = [
        container_state(attrs) for attrs in engine.containers(labels)
        if attrs.get("State", {}).get("Running")
    ]
    if not running:
        return None
    executor = Executor(engine, layout.applied, wait=lambda services: None, report=lambda _: None)
    executor.execute(ReloadProxy(proxy, running[0], "credentials changed"))
    return running[0].name


def login_status(spec: Spec, layout: SiteLayout, authorization: str) -> int:
    """The HTTP status the front door gives `GET /v1/models` with this Authorization header."""
    gate = Gate(target_for(spec, layout, None, timeout=10), probe_password(layout))
    return gate.fetch("GET", "/v1/models", credentials=authorization).status
