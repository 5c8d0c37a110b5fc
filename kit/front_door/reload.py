"""The running front door: find it, reload it in place, record what it loaded, prove logins.

The reload has one owner, used by `kit up` (kit/converge/apply.py) and by every credential change:
`nginx -t` in the container, SIGHUP, and a check that new workers took over. Old workers finish
the streams they carry, so none is dropped.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kit.engine import url as engine_url
from kit.engine.desired import PROXY_SERVICE, SERVICE_LABEL, ServiceState, project_filter
from kit.engine.docker_api import Engine, connect
from kit.engine.observe import ContainerState, ProxyLoaded, container_state, write_proxy_loaded
from kit.errors import KitError
from kit.front_door.client import DoorClient, ProbeFailure, probe_password, target_for
from kit.layout import SiteLayout
from kit.plan.build import NGINX_TEST
from kit.spec.model import Spec

RELOAD_SIGNAL = "SIGHUP"  # nginx re-reads its config and replaces its workers gracefully
WORKER_PROCESS = "nginx: worker process"  # how a serving nginx worker shows in the process list
RELOAD_CONFIRM_SECONDS = 10
RELOAD_POLL_SECONDS = 0.2
# nginx's alert when a worker cannot take worker_rlimit_nofile: it is above the hard limit the
# engine gives the container (raising it needs CAP_SYS_RESOURCE, which containers lack).
OPEN_FILES_REFUSED = "setrlimit(RLIMIT_NOFILE"


@dataclass(frozen=True)
class Connection:
    """How kit reaches a running front door: the engine it runs on, and a login through it
    (Authorization header → HTTP status). Tests pass a fake engine and a scripted login."""

    engine: Callable[[], Engine]
    login: Callable[[Spec, SiteLayout, str], int]
    proof_seconds: float = 5.0  # how long a login may take to show the change after a reload


def running_proxy(engine: Engine, site: str) -> ContainerState | None:
    """The site's running nginx container, or None when none runs (the stack is down)."""
    labels = [*project_filter(site), f"{SERVICE_LABEL}={PROXY_SERVICE}"]
    running = [
        container_state(attrs) for attrs in engine.containers(labels)
        if attrs.get("State", {}).get("Running")
    ]
    return running[0] if running else None


def reload(engine: Engine, service: ServiceState, container: ContainerState, applied: Path) -> None:
    """`nginx -t` of the mounted config first; SIGHUP only if it passes; then record it.

    nginx applies a SIGHUP asynchronously and, when it cannot (a listen socket it cannot
    bind), logs [emerg] and keeps the old config; so the reload counts only once new worker
    processes run, and an [emerg] line after the signal is reported as the failure it is.
    """
    code, output = engine.exec(container.id, NGINX_TEST)
    if code != 0:
        raise KitError(
            f"{container.name} rejected the new config; it keeps serving the old one:\n"
            f"{output.rstrip()}",
            fix="fix the spec value the error points at, then `kit up` again",
        )
    before = _workers(engine, container.id)
    signalled = time.time()
    engine.signal(container.id, RELOAD_SIGNAL)
    deadline = time.monotonic() + RELOAD_CONFIRM_SECONDS
    while not (now := _workers(engine, container.id)) or now & before:  # old ones stop accepting
        failed = [
            line for line in engine.log_since(container.id, signalled).splitlines()
            if "[emerg]" in line
        ]
        if failed or time.monotonic() > deadline:
            raise KitError(
                f"{container.name} did not apply the new config and keeps the old one: "
                + ("\n" + "\n".join(failed) if failed else
                   f"no new worker processes {RELOAD_CONFIRM_SECONDS}s after {RELOAD_SIGNAL}"),
                fix=f"restart it to load the config afresh: docker restart {container.name}",
            )
        time.sleep(RELOAD_POLL_SECONDS)
    check_open_files(engine, container, signalled)
    record_loaded(applied, service, container.id)


def check_open_files(engine: Engine, container: ContainerState, since: float) -> None:
    """Workers that could not raise their open-files limit to the rendered worker_rlimit_nofile
    would refuse connections (EMFILE) long before the site's streams are reached: a failure,
    named with its fix, not a front door that silently carries less than planned."""
    refused = [line.strip() for line in engine.log_since(container.id, since).splitlines()
               if OPEN_FILES_REFUSED in line]
    if refused:
        raise KitError(
            f"{container.name} cannot open the connections the site's streams need; nginx says:"
            f"\n{refused[-1]}\nThe Docker engine gives its containers a lower open-files hard "
            "limit than the worker_rlimit_nofile kit rendered from the streams (2 per stream).",
            fix="raise the engine's limit for containers (`\"default-ulimits\": {\"nofile\": "
            "{\"Name\": \"nofile\", \"Soft\": 1048576, \"Hard\": 1048576}}` in "
            "/etc/docker/daemon.json, with LimitNOFILE at least as high in docker.service), "
            "restart Docker and run kit up again; or lower max_num_seqs or the replicas",
        )


def record_loaded(applied: Path, service: ServiceState, container_id: str) -> None:
    """A reloadable service read its mounted files when it started or reloaded: record which."""
    if service.reloadable and service.site_files_digest is not None:
        write_proxy_loaded(applied, ProxyLoaded(container_id, service.site_files_digest))


def _workers(engine: Engine, container_id: str) -> set[int]:
    return {pid for pid, command in engine.processes(container_id) if command == WORKER_PROCESS}


def login_status(spec: Spec, layout: SiteLayout, authorization: str) -> int:
    """The HTTP status the front door gives `GET /v1/models` with this Authorization header."""
    client = DoorClient(target_for(spec, layout, None, timeout=10), probe_password(layout))
    try:
        return client.fetch("GET", "/v1/models", credentials=authorization).status
    except ProbeFailure as error:
        raise KitError(
            f"the front door did not answer a login: {error}",
            fix="see `kit status` and `kit logs SPEC nginx`",
        ) from None


def live(spec: Spec) -> Connection:
    """The real engine of the site (its `engine:`, DOCKER_HOST or the socket) and front door."""
    return Connection(lambda: connect(engine_url.resolve(spec.engine)), login_status)
