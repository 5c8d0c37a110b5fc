"""A site brought up with `kit up` on the local test images, and the clients that talk to it.

Shared by the e2e tests (through their fixtures) and the front-door benchmarks (scripts/bench_*,
which run without pytest), so both measure and assert against the same stack: one vLLM stand-in
service behind the rendered nginx, with the spec's proxy limits and the stand-in's pacing chosen
by the caller. The clients are kit's own probe client (single requests), scripts/loadgen.py on
the host or inside the stack's backend network (many streams), and the OpenAI SDK.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import docker
import yaml

from kit.credentials.material import KEY_PREFIX
from kit.engine.desired import (
    NETWORK_LABEL,
    PROJECT_LABEL,
    PROMETHEUS_SERVICE,
    SERVICE_LABEL,
    VERIFIER_SERVICE,
)
from kit.engine.docker_api import Engine
from kit.front_door.client import basic_header, probe_password, target_for
from kit.front_door.gate import Gate
from kit.layout import SiteLayout
from kit.plan.host import load_spec
from kit.site import Site
from kit.views.live_figures import api_argv
from tests.support.docker_engine import IMAGES, pick_free_port, remove_project
from tests.support.sites import LLAMA_8B, REPO

LOADGEN = REPO / "scripts" / "loadgen.py"
CLIENT_IMAGE = IMAGES["vllm_standin"]  # has python3: runs loadgen.py in the stack's network
DOMAIN = "llm.test"  # not resolvable: clients connect to 127.0.0.1 and send it in SNI and Host
SERVICE = "tiny"
SERVED_NAME = "tiny-chat"
RELOAD_TIMEOUT_S = 20


class _SpecDumper(yaml.SafeDumper):
    """Writes a value shared by two keys out twice: a site spec refuses YAML anchors."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def write_spec(path: Path, spec: dict) -> None:
    path.write_text(yaml.dump(spec, Dumper=_SpecDumper, sort_keys=False))


def write_multinode_spec(spec: Path, models: Path, site: str, free_port, **service) -> None:
    """A site whose service `big` runs the stand-in over the given nodes (1 GPU each);
    `models` holds its config.json (the same path on every node: the hosts share a disk)."""
    (models / SERVICE).mkdir(parents=True)
    (models / SERVICE / "config.json").write_text(json.dumps(LLAMA_8B))
    write_spec(spec, {
        "site": site, "domain": DOMAIN, "models_root": str(models), "healthcheck_interval": 1,
        "auth": {"users": ["ops"], "api_keys": True},
        "proxy": {"bind": "127.0.0.1", "https_port": free_port(), "http_port": free_port()},
        "services": [{
            "name": "big", "model": SERVICE, "served_name": "big-chat", "gpus": [0],
            "tensor_parallel": 1, "pipeline_parallel": 2, "max_model_len": 4096, **service,
            "env": {"STANDIN_LOAD_SECONDS": "1", "STANDIN_JOIN_TIMEOUT_S": "120"},
        }],
    })


def kit(*args: str, stdin: str | None = None, timeout: float = 300,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the kit CLI as an operator would (a fresh process; `env` adds to the environment)."""
    return subprocess.run([sys.executable, "-m", "kit", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def timed_kit(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    """`kit(*args)` and the seconds it took: a baseline measured beside the command a test times,
    so a bound can hold on a machine other tests load (docs/testing.md)."""
    started = time.monotonic()
    result = kit(*args)
    return result, time.monotonic() - started


def checked(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    if result.returncode != 0:
        raise AssertionError(f"{result.args[3:]} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


@dataclass
class LiveSite:
    """A site folder (spec, rendered files, credentials) and its stack on the engine."""

    root: Path
    name: str
    client: docker.DockerClient
    https_port: int
    passwords: dict[str, str] = field(default_factory=dict)  # printed once by `kit render`

    @classmethod
    def create(cls, root: Path, client: docker.DockerClient, https_port: int, http_port: int, *,
               prefix: str = "kit", users: tuple[str, ...] = ("ops",), proxy: dict | None = None,
               env: dict[str, str] | None = None, max_num_seqs: int = 256,
               more_services: dict[str, str] | None = None, tls: dict | None = None,
               overrides: dict[str, dict] | None = None, usage: dict | None = None) -> LiveSite:
        """Write the spec and render it (not up yet): one stand-in service `tiny`, and one per
        `more_services` entry (service name → served name), all sharing GPU 0 unless
        `overrides` (service name → spec keys) says otherwise (e.g. gpus and routing);
        `usage`: the spec's `usage:` keys."""
        site = cls(root, f"{prefix}{secrets.token_hex(3)}", client, https_port)
        models = root / "models"
        (models / SERVICE).mkdir(parents=True)
        (models / SERVICE / "config.json").write_text(json.dumps(LLAMA_8B))
        spec = {
            "site": site.name,
            "domain": DOMAIN,
            "models_root": str(models),
            "healthcheck_interval": 1,
            "auth": {"users": list(users), "api_keys": True},
            **({"tls": tls} if tls else {}),
            **({"usage": usage} if usage else {}),
            "proxy": {"bind": "127.0.0.1", "https_port": https_port, "http_port": http_port,
                      **(proxy or {})},
            "services": [{
                "name": name, "model": SERVICE, "served_name": served, "gpus": [0],
                "max_model_len": 4096, "max_num_seqs": max_num_seqs,
                "gpu_memory_utilization": round(0.9 / (1 + len(more_services or {})), 2),
                "env": {"STANDIN_LOAD_SECONDS": "1", **(env or {})},
                **(overrides or {}).get(name, {}),
            } for name, served in {SERVICE: SERVED_NAME, **(more_services or {})}.items()],
        }
        write_spec(site.spec_path, spec)
        rendered = checked(site.kit("render")).stdout
        site.passwords = dict(re.findall(r"^password for (\S+): (\S+)$", rendered, re.MULTILINE))
        return site

    @property
    def spec_path(self) -> Path:
        return self.root / "site.yaml"

    @property
    def layout(self) -> SiteLayout:
        return SiteLayout(self.root)

    def kit(self, verb: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        """`kit VERB SPEC ARGS…` (the group verbs take `users add`, `keys revoke`, …)."""
        words = verb.split()
        return kit(*words, str(self.spec_path), *args, stdin=stdin)

    def up(self) -> None:
        result = checked(self.kit("up"))
        assert "all checks passed" in result.stdout, result.stdout  # kit up ends with the gate

    def down(self) -> None:
        checked(self.kit("down", "--volumes"))

    def container(self, service: str):
        labels = [f"{PROJECT_LABEL}={self.name}", f"{SERVICE_LABEL}={service}"]
        (found,) = self.client.containers.list(all=True, filters={"label": labels})
        return found

    @property
    def nginx(self):
        return self.container("nginx")

    @property
    def verifier(self):
        return self.container(VERIFIER_SERVICE)

    def password_checks(self, since: float, user: str | None = None) -> int:
        """bcrypt checks the verifier ran since then (its access log: one line per check), of
        every user or of this one."""
        logs = self.verifier.logs(since=int(since), stdout=True, stderr=False)
        return sum('"GET /verify ' in line and (user is None or f" {user} [" in line)
                   for line in logs.decode(errors="replace").splitlines())

    def network(self, key: str) -> str:
        """The engine name of the compose network `key` (e.g. backend)."""
        labels = [f"{PROJECT_LABEL}={self.name}", f"{NETWORK_LABEL}={key}"]
        (found,) = self.client.networks.list(filters={"label": labels})
        return found.name

    # ---- credentials and single requests

    def add_key(self, name: str) -> str:
        added = checked(self.kit("keys add", name))
        return re.search(re.escape(KEY_PREFIX) + r"[A-Za-z0-9_-]+", added.stdout).group(0)

    def basic(self, user: str) -> str:
        return basic_header(user, self.passwords[user])

    def gate(self) -> Gate:
        """kit's probe client: HTTPS to 127.0.0.1 with the domain in SNI, Host and cert check."""
        layout = self.layout
        return Gate(target_for(load_spec(self.spec_path), layout, None, 10), probe_password(layout))

    def status(self, path: str = "/v1/models", credentials: str | None = None,
               method: str = "GET", body: dict | None = None) -> int:
        return self.gate().fetch(method, path, body=body, credentials=credentials).status

    def completion(self, credentials: str, tokens: int = 4) -> int:
        body = {"model": SERVED_NAME, "max_tokens": tokens,
                "messages": [{"role": "user", "content": "Say hi."}]}
        return self.status("/v1/chat/completions", credentials, "POST", body)

    # ---- nginx

    def reload_nginx(self) -> None:
        reload_nginx(self.nginx)

    def nginx_conf_with(self, *edits: tuple[str, str]) -> str:
        """The rendered nginx.conf with each (old, new) replaced; fails when `old` is missing."""
        text = self.layout.nginx_conf.read_text()
        for old, new in edits:
            assert old in text, f"nginx.conf no longer contains {old!r}: update the caller"
            text = text.replace(old, new)
        return text

    def load_nginx_conf(self, text: str) -> None:
        """Write nginx.conf (by hand, as an operator might) and reload when it changed."""
        if self.layout.nginx_conf.read_text() != text:
            self.layout.nginx_conf.write_text(text)
            self.reload_nginx()

    def nginx_log(self, since: float) -> str:
        return self.nginx.logs(since=int(since), stdout=True, stderr=True).decode(errors="replace")

    # ---- many streams, the OpenAI SDK

    def loadgen(self, auth: str | list[str] | None, *, streams: int, tokens: int,
                announce: bool = False, requests: int = 1, pause: float = 0,
                duration: float = 0, timeout: float = 120,
                ca: Path | None = None, model: str = SERVED_NAME) -> subprocess.Popen:
        """scripts/loadgen.py on the host against the published port (stdout: one JSON line),
        trusting `ca` (default: the kit CA), asking for `model` (the served name, or an adapter).

        Several `auth` values: connection i sends the (i mod n)-th (many distinct users).
        """
        command = [sys.executable, str(LOADGEN), "--url", f"https://127.0.0.1:{self.https_port}",
                   "--host", DOMAIN, "--ca", str(ca or self.layout.ca_cert), "--model", model,
                   "--streams", str(streams), "--tokens", str(tokens),
                   "--requests", str(requests), "--pause", str(pause),
                   "--duration", str(duration), "--timeout", str(timeout)]
        command += auth_options(auth)
        if announce:
            command.append("--announce")
        load = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        STARTED_LOADS.append(load)
        return load

    def up_under_load(self, streams: int, model: str = SERVED_NAME
                      ) -> tuple[subprocess.CompletedProcess, int, dict]:
        """`kit up` while batches of `streams` streams (a fresh key) on `model` run back to back
        from 2 s before until 2 s after it: its result, the requests sent and the failures by
        cause."""
        result, _, _, requests, failed = self.kit_under_load(streams, "up", models=(model,))
        return result, requests, failed

    def kit_under_load(self, streams: int, verb: str, *args: str,
                       models: tuple[str, ...] = (SERVED_NAME,),
                       after: Callable[[], object] = lambda: None, key: str | None = None,
                       ) -> tuple[subprocess.CompletedProcess, float, object, int, dict]:
        """`kit VERB ARGS` while, per model in `models`, batches of `streams` streams (a fresh
        key; one request per connection, as a reload closes idle keep-alive ones) run back to
        back from 2 s before until 2 s after it; `after` runs the moment it returned; `key`:
        the streams' key (made earlier: adding one reloads nginx, which fails while a replica is
        killed). Its result, its seconds, what `after` returned, the requests sent, the
        failures by cause."""
        key = key or self.add_key(f"load-{secrets.token_hex(2)}")
        batches: list[dict] = []
        done = threading.Event()

        def load(model: str) -> None:
            while not done.is_set():
                batches.append(finished(self.loadgen(f"Bearer {key}", streams=streams, tokens=60,
                                                     model=model)))

        loading = [threading.Thread(target=load, args=(model,)) for model in models]
        for thread in loading:
            thread.start()
        try:
            time.sleep(2)
            started = time.monotonic()
            result = self.kit(verb, *args)
            seconds = time.monotonic() - started
            seen = after()
            time.sleep(2)
        finally:
            done.set()
            for thread in loading:
                thread.join(timeout=120)
        failed = {k: v for b in batches for k, v in b["failures"].items()}
        return result, seconds, seen, sum(b["requests"] for b in batches), failed

    def openai(self, api_key: str, *, http2: bool = False):
        """The OpenAI Python SDK (openai>=3, httpx2) aimed at this site, trusting the kit CA;
        `http2`: its client offers h2 in ALPN (and HTTP/1.1), as an application would ask."""
        import httpx2
        import openai

        class ToLoopback(httpx2.HTTPTransport):
            """Connect to 127.0.0.1 while SNI, the certificate check and Host keep the domain."""

            def handle_request(self, request):
                return super().handle_request(to_loopback(request))

        trust = ssl.create_default_context(cafile=str(self.layout.ca_cert))
        return openai.OpenAI(
            base_url=f"https://{DOMAIN}:{self.https_port}/v1", api_key=api_key, max_retries=0,
            http_client=httpx2.Client(transport=ToLoopback(verify=trust, http2=http2)),
        )

    def h2_client(self, connections: int = 1, *, http2: bool = True):
        """An asyncio HTTP/2-only client (httpx2) for this site's door, trusting the kit CA, with
        at most `connections` connections: every concurrent request is a stream on them
        (http2=False: the same client speaking HTTP/1.1 only, a request a connection)."""
        import httpx2

        class ToLoopback(httpx2.AsyncHTTPTransport):
            async def handle_async_request(self, request):
                return await super().handle_async_request(to_loopback(request))

        trust = ssl.create_default_context(cafile=str(self.layout.ca_cert))
        limits = httpx2.Limits(max_connections=connections)
        transport = ToLoopback(verify=trust, http1=not http2, http2=http2, limits=limits)
        return httpx2.AsyncClient(base_url=f"https://{DOMAIN}:{self.https_port}",
                                  transport=transport, timeout=120)

    def h2_settings(self) -> dict[str, int]:
        """The SETTINGS the door sends an HTTP/2 client (h2's names, e.g.
        max_concurrent_streams): what it promises before any stream."""
        import h2.config
        import h2.connection
        import h2.events

        context = ssl.create_default_context(cafile=str(self.layout.ca_cert))
        context.set_alpn_protocols(["h2"])
        with socket.create_connection(("127.0.0.1", self.https_port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname=DOMAIN) as tls:
            assert tls.selected_alpn_protocol() == "h2"
            connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            connection.initiate_connection()
            tls.sendall(connection.data_to_send())
            while True:
                data = tls.recv(65536)
                assert data, "the door closed the connection before its SETTINGS"
                for event in connection.receive_data(data):
                    if isinstance(event, h2.events.RemoteSettingsChanged):
                        return {getattr(code, "name", str(code)).lower(): setting.new_value
                                for code, setting in event.changed_settings.items()}


def to_loopback(request):
    """An httpx2 request sent to 127.0.0.1 while SNI, the certificate check and Host keep the
    domain (DOMAIN does not resolve)."""
    request.url = request.url.copy_with(host="127.0.0.1")
    request.extensions["sni_hostname"] = DOMAIN
    return request


def query(site: LiveSite, path: str, **params: str) -> dict:
    """Prometheus's HTTP API, asked from inside its container (it publishes no port) with the
    credentials of its environment, as kit status asks it."""
    answer = json.loads(read_in(site.container(PROMETHEUS_SERVICE), api_argv(path, params or None)))
    assert answer["status"] == "success", answer
    return answer["data"]


def query_results(site: LiveSite, exprs: list[str]) -> list[list]:
    """Each instant query's result, as `query` asks it, but all in one exec (a walk of every
    dashboard expression costs one exec, not one each)."""
    asks = [api_argv("/api/v1/query", {"query": expr})[2] for expr in exprs]
    text = read_in(site.container(PROMETHEUS_SERVICE),
                   ["sh", "-c", " && ".join(f"{{ {ask}; }} && echo" for ask in asks)])
    answers, at, decoder = [], 0, json.JSONDecoder()
    while text[at:].strip():
        answer, at = decoder.raw_decode(text, len(text) - len(text[at:].lstrip()))
        answers.append(answer)
    assert len(answers) == len(exprs), text
    assert all(answer["status"] == "success" for answer in answers), answers
    return [answer["data"]["result"] for answer in answers]


RULE = re.compile(r"^(?P<signal>.+) (==|!=|>|<|>=|<=) [-0-9.e]+$")  # `signal op threshold`


def promql_expressions(site: LiveSite, rate_window: str = "30s") -> list[tuple[str, str]]:
    """(where, PromQL) of every dashboard panel target (Grafana's $__rate_interval walked as
    `rate_window`: 30 s, four scrapes at the tests' 1 s and then some) and every alert rule's
    signal, as the site rendered them."""
    found = []
    for path in sorted((site.root / "observability/grafana/dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                found.append((f"{path.name}: {panel['title']}",
                              target["expr"].replace("$__rate_interval", rate_window)))
    rules = yaml.safe_load((site.root / "observability/prometheus/rules.yml").read_text())
    for rule in rules["groups"][0]["rules"]:
        match = RULE.match(rule["expr"])
        assert match, f"{rule['alert']}: not `signal op threshold`: {rule['expr']}"
        found.append((f"rule {rule['alert']}", match["signal"]))
    return found


def wait_for(what: str, check, timeout: float) -> float:
    """Seconds until check() is true; fails after `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout} s")


UNREACHABLE = {6: "name not resolved", 7: "connection refused or no route", 28: "timed out"}
NAME_CONNECT_S = 1  # curl's connect_s for a name that must not resolve (a known one: ms)


def run_in(container, argv: list[str]) -> tuple[int, str]:
    """(exit code, output) of `argv` run in `container`, read by kit's own Engine.exec: docker-py's
    exec_run reads the socket beneath the HTTP response, past the bytes http.client buffered with
    its headers (CI under load: empty answers, a frame header inside the text)."""
    return Engine(container.client.api).exec(container.id, argv)


def read_in(container, argv: list[str]) -> str:
    """The output of a read-only command run in `container`, its exit 0 asserted."""
    code, output = run_in(container, argv)
    assert code == 0, output
    return output


# Every loadgen a LiveSite started in this process, for stop_loads().
STARTED_LOADS: list[subprocess.Popen] = []


def stop_loads() -> None:
    """Kill every loadgen still running: a test that failed half-way must not send its load into
    the next test on a shared stack (CI: a session's requests counted on a second replica were a
    failed neighbour's)."""
    for load in STARTED_LOADS:
        if load.poll() is None:
            load.kill()
            load.communicate()
    STARTED_LOADS.clear()


def curl(container, url: str, *headers: str, method: str = "GET",
         connect_s: float | None = None) -> tuple[int, str]:
    """curl from inside a container: (curl's exit code, the status or curl's error).
    `connect_s`: at most this long to resolve the name and connect (3 s in all else). A name
    Docker's DNS does not know is forwarded, and on an internal network that waits out the
    whole timeout; one it knows resolves in milliseconds (7 ms, then 86 ms to connect, at a
    load average of 15)."""
    args = [arg for header in headers for arg in ("-H", header)]
    if connect_s is not None:
        args += ["--connect-timeout", str(connect_s)]
    code, out = run_in(container, ["curl", "-sS", "-m", "3", "-X", method, "-o", "/dev/null",
                                   "-w", "%{http_code}", *args, url])
    return code, out.strip()


def auth_options(auth: str | list[str] | None) -> list[str]:
    """loadgen's --auth options: one value, or several (connection i sends the i mod n-th)."""
    values = [auth] if isinstance(auth, str) else auth or []
    return [option for value in values for option in ("--auth", value)]


def reload_nginx(nginx) -> None:
    """SIGHUP, then wait until no worker of the old configuration is left."""
    before = nginx_workers(nginx)
    nginx.kill(signal="SIGHUP")
    deadline = time.monotonic() + RELOAD_TIMEOUT_S
    while time.monotonic() < deadline:
        now = nginx_workers(nginx)
        if now and not now & before:
            return
        time.sleep(0.1)
    logs = nginx.logs(tail=20).decode(errors="replace")
    raise AssertionError(f"nginx kept its old workers after SIGHUP:\n{logs}")


def nginx_workers(container) -> set[str]:
    top = container.top()
    pid, command = top["Titles"].index("PID"), top["Titles"].index("CMD")
    return {row[pid] for row in top["Processes"] or [] if "worker process" in row[command]}


def finished(process: subprocess.Popen, timeout: float = 120) -> dict:
    """The JSON figures a loadgen process printed."""
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"loadgen failed:\n{err}"
    return json.loads(out)


class LoadClient:
    """A container on the site's backend networks (kit's own and each service's) that runs
    scripts/loadgen.py (read-only mount), so the same client reaches nginx and the vLLM
    services, which publish no port."""

    def __init__(self, site: LiveSite) -> None:
        self.container = site.client.containers.run(
            CLIENT_IMAGE, ["infinity"], entrypoint=["sleep"], detach=True,
            name=f"{site.name}-loadgen", network=site.network("backend"),
            labels={PROJECT_LABEL: site.name},
            volumes={str(LOADGEN.parent): {"bind": "/kit/scripts", "mode": "ro"},
                     str(site.layout.tls_dir): {"bind": "/kit/tls", "mode": "ro"}},
        )
        for network in site.client.networks.list(filters={"label": f"{PROJECT_LABEL}={site.name}"}):
            if network.attrs["Labels"].get(NETWORK_LABEL, "").startswith("backend-"):
                network.connect(self.container)

    def run(self, url: str, *, streams: int, tokens: int, host: str | None = None,
            auth: str | list[str] | None = None, ramp: float = 0, requests: int = 1,
            duration: float = 0, timeout: float = 120, spread: tuple[str, ...] = ()) -> dict:
        command = ["python3", "/kit/scripts/loadgen.py", "--url", url, "--model", SERVED_NAME,
                   "--streams", str(streams), "--tokens", str(tokens), "--ramp", str(ramp),
                   "--requests", str(requests), "--duration", str(duration),
                   "--timeout", str(timeout)]
        if url.startswith("https:"):
            command += ["--ca", "/kit/tls/ca.crt"]
        if host:
            command += ["--host", host]
        command += auth_options(auth)
        command += [option for host in spread for option in ("--spread", host)]
        code, output = self.container.exec_run(command, demux=True)
        stdout, stderr = output
        if code != 0:
            raise RuntimeError(f"loadgen exited {code}: {(stderr or b'').decode()}")
        return json.loads(stdout)

    def remove(self) -> None:
        self.container.remove(force=True)


def cpu_seconds(container) -> float:
    """CPU time the container has used so far (its cgroup's total)."""
    stats = container.client.api.stats(container.id, stream=False, one_shot=True)
    return stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9


@contextmanager
def running(root: Path, client: docker.DockerClient, *,
            small_volumes: dict[str, str] | None = None, **options) -> Iterator[LiveSite]:
    """For the tests' fixtures: a site (LiveSite.create's options) on two free ports, up; its
    compose project removed afterwards, also when `kit up` failed. `small_volumes` (compose
    volume key → size, e.g. {"usage-ledger": "2m"}): those volumes are created first, as kit
    would (its name and labels), but on a tmpfs of that size, so a test can fill them up."""
    site = LiveSite.create(root, client, pick_free_port(), pick_free_port(), **options)
    try:
        for volume in Site.load(site.spec_path, check_host=False).desired.volumes:
            if volume.key in (small_volumes or {}):
                client.volumes.create(volume.name, driver="local", labels=volume.labels,
                                      driver_opts={"type": "tmpfs", "device": "tmpfs",
                                                   "o": f"size={small_volumes[volume.key]}"})
        site.up()
        yield site
    finally:
        remove_project(client, site.name)


@contextmanager
def edited(root: Path, client: docker.DockerClient, edit: Callable[[dict], None],
           **options) -> Iterator[LiveSite]:
    """For the tests' fixtures: a site (LiveSite.create's options) whose spec `edit` changes
    (in place) before it is rendered again, up; its compose project removed afterwards."""
    site = LiveSite.create(root, client, pick_free_port(), pick_free_port(), **options)
    try:
        spec = yaml.safe_load(site.spec_path.read_text())
        edit(spec)
        write_spec(site.spec_path, spec)
        checked(site.kit("render"))
        site.up()
        yield site
    finally:
        remove_project(client, site.name)


@contextmanager
def observed(root: Path, client: docker.DockerClient, observability: dict,
             slo: dict | None = None, **options) -> Iterator[LiveSite]:
    """For the tests' fixtures: a site (LiveSite.create's options) with `observability:` on as
    given (and `slo:` on its first service), up; its compose project removed afterwards."""

    def edit(spec: dict) -> None:
        spec["observability"] = {"enabled": True, **observability}
        if slo:
            spec["services"][0]["slo"] = slo

    with edited(root, client, edit, **options) as site:
        yield site


@contextmanager
def running_site(root: Path, client: docker.DockerClient, https_port: int, http_port: int,
                 **options) -> Iterator[LiveSite]:
    """For scripts without pytest's fixtures: a site that is up, and gone afterwards."""
    site = LiveSite.create(root, client, https_port, http_port, **options)
    try:
        site.up()
        yield site
    finally:
        site.down()


def kill_port_forwarder(host_port: int) -> list[int]:
    """Make a published port dead while its container runs on: SIGKILL the engine's userland
    forwarder (docker-proxy) for `host_port` in this network namespace (the engine's), as when
    it crashed. Returns the pids killed; loopback connections go through it whatever the
    engine's iptables setting."""
    own_net = os.readlink("/proc/self/ns/net")
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            same_net = os.readlink(entry / "ns" / "net") == own_net
        except OSError:
            continue  # gone meanwhile, or not ours to read
        flags = dict(zip(argv[1::2], argv[2::2], strict=False))
        if same_net and argv[0].endswith(b"docker-proxy") and \
                flags.get(b"-host-port") == str(host_port).encode():
            os.kill(int(entry.name), 9)
            killed.append(int(entry.name))
    return killed


FILLER = "kit-test-filler"
_FILL = """import errno, os, sys
fd = os.open(os.path.join(sys.argv[1], sys.argv[2]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
size = 1 << 16
while size:
    try:
        os.write(fd, bytes(size))
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        size //= 2
os.fsync(fd)
info = os.statvfs(sys.argv[1])
print(info.f_bavail * info.f_frsize)
"""


def fill_disk(container, folder: str) -> int:
    """Fill the filesystem of `folder` inside `container` with one file, to the last byte (a
    full disk, as a volume on a full host disk would be): the bytes still free (0)."""
    code, output = container.exec_run(["python3", "-c", _FILL, folder, FILLER])
    assert code == 0, output.decode(errors="replace")
    return int(output.decode().split()[-1])


def free_disk(container, folder: str) -> None:
    """Give back what fill_disk took."""
    code, output = container.exec_run(["rm", f"{folder}/{FILLER}"])
    assert code == 0, output.decode(errors="replace")
