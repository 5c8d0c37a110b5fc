"""Plan → files. Templates hold the layout; every decision was made in the plan.

`render_site` is the whole `kit render`: finish an interrupted render, validate, plan, compute
every output, refuse to clobber hand edits, then write every change as one transaction
(kit.files.commit). Nothing is written when any step fails.
"""

import json
import os
import re
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import jinja2

from kit import __version__
from kit.credentials.material import (
    SECRET,
    UNKNOWN_USER,
    AuthFiles,
    NewPassword,
    auth_outputs,
    forget_shown_passwords,
    prometheus_auth_outputs,
    unknown_user_file,
    unshown_passwords,
    unshown_passwords_output,
)
from kit.credentials.policy import check_budgets_counted, read_policies
from kit.credentials.tls import acme_files, self_signed_files, tls_outputs, user_files
from kit.engine.desired import (
    ACME_SERVICE,
    PROMETHEUS_SERVICE,
    PROXY_SERVICE,
    REPLICA_INDEX_LABEL,
    REPLICA_SERVICE_LABEL,
    SLEEP_LEVEL_LABEL,
    SWAP_GROUP_LABEL,
    VERIFIER_SERVICE,
)
from kit.engine.envfile import env_file_text
from kit.errors import BadInput
from kit.files import (
    Change,
    Output,
    commit,
    digest,
    generated_yaml,
    hand_edits,
    interrupted,
    manifest_content,
    pending_changes,
    read_manifest,
    recover,
    remove_stale_temps,
)
from kit.layout import LORA_MOUNT, NGINX_MOUNT, VERIFIER_AUTH_MOUNT, VERIFIER_MOUNT, SiteLayout
from kit.names import OPENAI_ROUTES
from kit.plan.build import (
    ADAPTER_KEY,
    HEALTHZ_PORT,
    HF_CACHE_MOUNT,
    MODELS_MOUNT,
    PREFIX_KEY,
    REPLICA_FAIL_TIMEOUT,
    SITE_HF_CACHE_MOUNT,
    UNAVAILABLE_RETRY_AFTER,
    VLLM_ENTRYPOINT,
    VLLM_PORT,
    Plan,
    ServicePlan,
    build_plan,
)
from kit.plan.host import spec_warnings
from kit.plan.observability import DOOR_SCRIPT
from kit.plan.usage import DOOR_SPOOL_MOUNT, SPOOL_VOLUME
from kit.render.alertmanager import alertmanager_files, secret_outputs
from kit.render.alertmanager import template_facts as alertmanager_facts
from kit.render.dashboards import dashboard_files, dashboard_provisioning, datasource_provisioning
from kit.render.node_files import worker_outputs
from kit.render.prometheus import prometheus_config, rules_file, template_facts
from kit.render.usage import usage_facts, usage_files
from kit.render.waker import waker_facts, waker_files
from kit.site import Site
from kit.site_lock import site_lock
from kit.spec.model import Spec

# What may stand bare in an nginx directive: no space, quote, `;`, `{`, `}`, `#` or `$`.
NGINX_TOKEN = re.compile(r"[A-Za-z0-9._:/@\[\]-]+")


def _template_source(name: str) -> tuple[str, str, Callable[[], bool]]:
    path = resources.files("kit.templates").joinpath(name)
    return path.read_text(), str(path), lambda: True


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates cached per user: parsing them is most of a render's own time."""
    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kit" / "jinja"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(str(folder)) if os.access(folder, os.W_OK) else None


def nginx_token(value: object) -> str:
    """A value as one bare nginx word; refused when it could end the directive or name a variable.

    The spec allow-lists every value already: this is the template's own guard, so no value can
    change what a rendered nginx.conf means even if a spec check missed it.
    """
    text = str(value)
    if not NGINX_TOKEN.fullmatch(text):
        raise BadInput(f"{text!r} cannot be written into nginx.conf",
                       fix="use letters, digits and . _ : / - only")
    return text


def nginx_string(value: object) -> str:
    """A value as one double-quoted nginx string (quotes and backslashes escaped, no `$`)."""
    text = str(value)
    if "$" in text or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise BadInput(f"{text!r} cannot be written into nginx.conf",
                       fix="remove `$` and control characters from the value")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def comment(value: object) -> str:
    """A value inside a `#` comment line: a line break would end the comment, so none is kept."""
    return "".join("?" if ord(c) < 32 or ord(c) == 127 else c for c in str(value))


def compose_json(value: object) -> str:
    """JSON for the compose file with `$` doubled: compose would interpolate a lone `$` (a shell
    variable in a command), and `$$` is its literal `$` (kit/engine/desired.py reads it back so)."""
    return json.dumps(value, ensure_ascii=False).replace("$", "$$")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_template_source),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        bytecode_cache=_bytecode_cache(),
    )
    env.filters["nginx_token"] = nginx_token
    env.filters["nginx_string"] = nginx_string
    env.filters["comment"] = comment
    env.filters["compose_json"] = compose_json
    env.filters["upstream"] = lambda name: "kit_" + nginx_token(name).replace("-", "_")
    env.filters["url_host"] = lambda host: f"[{host}]" if ":" in host else host
    return env


def routes_table(plan: Plan) -> bytes:
    """The table route.js routes by (nginx preloads it: `js_preload_object kit_routes`): served
    name → service, compared exactly as vLLM does; a LoRA adapter's name → {service, parent:
    the base's served name} (docs/adapters.md). Data, never code: no served name can change
    route.js. Preloaded, not imported: njs runs an imported module's top level in every request's
    VM, so a module's table was rebuilt for each request (docs/benchmarks.md)."""
    routes: dict[str, str | dict[str, str]] = {svc.api_name: svc.name for svc in plan.services}
    routes |= {adapter: {"service": svc.name, "parent": svc.api_name}
               for svc in plan.services for adapter in svc.adapters}
    return (json.dumps(routes, indent=4, sort_keys=True) + "\n").encode()


def replica_pool(service: ServicePlan) -> bytes:
    """The `server` lines of a multi-replica service, every replica in service. Not tracked as
    a golden file: kit up marks one `down` while it replaces it (kit/converge/rollout.py), and
    the next render puts every one back."""
    lines = [f"# Generated by kit: the replicas of {nginx_token(service.name)} (kit up marks "
             "one down while it replaces it)."]
    lines += [f"server {nginx_token(replica.host)}:{VLLM_PORT} max_fails=1 "
              f"fail_timeout={REPLICA_FAIL_TIMEOUT}s;" for replica in service.replicas]
    return ("\n".join(lines) + "\n").encode()


DOCKER_DNS = "127.0.0.11"  # the engine's resolver on user-defined networks


def template_context(plan: Plan, spec_name: str) -> dict:
    """What the templates read, for the compose stack: services reached by their compose names
    on the private networks, names resolved by Docker's DNS (`kit export k8s` swaps these)."""
    https = plan.nginx.https_port
    return {
        "plan": plan,
        "n": plan.nginx,
        "spec_name": spec_name,
        "kit_version": __version__,
        "vllm_port": VLLM_PORT,
        "vllm_entrypoint": list(VLLM_ENTRYPOINT),
        "models_mount": MODELS_MOUNT,
        "hf_cache_mount": HF_CACHE_MOUNT,
        "site_hf_cache_mount": SITE_HF_CACHE_MOUNT,
        "lora_mount": LORA_MOUNT,
        # a service's adapters folder, relative to the compose file (compose/)
        "lora_sources": {service.name: f"../{SiteLayout(Path('.')).lora_dir(service.name)}"
                         for service in plan.services if service.lora_config is not None},
        "nginx_mount": NGINX_MOUNT,
        "verifier_mount": VERIFIER_MOUNT,
        "verifier_auth_mount": VERIFIER_AUTH_MOUNT,
        "proxy_service": PROXY_SERVICE,
        "verifier_service": VERIFIER_SERVICE,
        "acme_service": ACME_SERVICE,
        "replica_service_label": REPLICA_SERVICE_LABEL,
        "replica_index_label": REPLICA_INDEX_LABEL,
        "swap_group_label": SWAP_GROUP_LABEL,
        "sleep_level_label": SLEEP_LEVEL_LABEL,
        "replica_fail_timeout": REPLICA_FAIL_TIMEOUT,
        "unavailable_retry_after": UNAVAILABLE_RETRY_AFTER,
        "prefix_key": PREFIX_KEY,
        "adapter_key": ADAPTER_KEY,
        # prefix routing's services and their ε, as balance.js reads them ("service=ε ...")
        "bounded_load": " ".join(f"{svc.name}={svc.load_bound:g}" for svc in plan.services
                                 if svc.load_bound is not None),
        "adapter_affinity": any(ADAPTER_KEY in (svc.affinity_hash or "") for svc in plan.services),
        "openai_routes": OPENAI_ROUTES,
        "unknown_user": UNKNOWN_USER,
        "nginx_health_url": f"http://127.0.0.1:{HEALTHZ_PORT}/kit-healthz",
        "https_port_suffix": "" if https == 443 else f":{https}",
        "service_hosts": {service.name: service.name for service in plan.services},
        "dns_resolver": DOCKER_DNS,
        "o": template_facts(plan),
        "usage": usage_facts(plan),
        "usage_spool_volume": SPOOL_VOLUME,
        "usage_door_mount": DOOR_SPOOL_MOUNT,
        "waker": waker_facts(plan),
        "am": alertmanager_facts(plan),
    }


def render_template(name: str, context: dict) -> bytes:
    return _environment().get_template(name).render(context).encode()


def generated_files(plan: Plan, spec_name: str) -> list[Output]:
    """The files that are a pure function of the plan (committed as golden files)."""
    env = _environment()
    context = template_context(plan, spec_name)
    layout = SiteLayout(Path("."))
    env_files = [
        Output(layout.env_file(service.name), env_file_text(service.env, spec_name).encode(),
               SECRET, secret=True)
        for service in plan.services
    ]
    return [
        Output(
            layout.compose_file,
            env.get_template("docker-compose.yml.j2").render(context).encode(),
        ),
        *env_files,
        Output(layout.nginx_conf, env.get_template("nginx.conf.j2").render(context).encode()),
        Output(
            layout.verifier_conf,
            env.get_template("verifier.conf.j2").render(context).encode(),
        ),
        Output(layout.verifier_js, door_module("verifier.js")),
        Output(layout.unknown_user_file, unknown_user_file()),
        Output(layout.routes_json, routes_table(plan)),
        *worker_outputs(plan, spec_name),
        *(Output(layout.lora_config(service.name), generated_yaml(service.lora_config).encode())
          for service in plan.services if service.lora_config is not None),
        *(Output(layout.replica_pool(service.name), replica_pool(service), generated=False)
          for service in plan.services if len(service.replicas) > 1),
        *(Output(layout.nginx_dir / name, door_module(name)) for name in DOOR_MODULES),
        *observability_files(plan, layout),
        *usage_files(plan, layout),
        *waker_files(plan, layout),
        *alertmanager_files(plan, layout),
    ]


# The front door's njs modules (kit/dataplane/door/), each beside nginx.conf, where js_path finds
# them and they find each other; verifier.js is the verifier's own.
DOOR_MODULES = ("auth.js", "balance.js", "json.js", "policy.js", "route.js", "usage.js",
                "wake.js", "figures.js")


def door_module(name: str) -> bytes:
    """One njs module of kit/dataplane/door/, as the site's nginx folder gets it."""
    return resources.files("kit.dataplane.door").joinpath(name).read_bytes()


def observability_files(plan: Plan, layout: SiteLayout) -> list[Output]:
    """Prometheus's config and rules, Grafana's provisioning and kit's dashboards (none when
    observability is off)."""
    if plan.observability is None:
        return []
    texts = {
        layout.prometheus_dir / "prometheus.yml": prometheus_config(plan),
        layout.prometheus_dir / "rules.yml": rules_file(plan),
        layout.grafana_provisioning_dir / "datasources" / "kit.yml":
            datasource_provisioning(PROMETHEUS_SERVICE),
        layout.grafana_provisioning_dir / "dashboards" / "kit.yml": dashboard_provisioning(),
        **{layout.grafana_dashboards_dir / name: text
           for name, text in dashboard_files(plan).items()},
    }
    # the counter's module (a valid module name), door-figures.py in its container
    script = resources.files("kit.dataplane.door_figures").joinpath("door_figures.py").read_text()
    texts[layout.door_figures_dir / DOOR_SCRIPT] = script
    return [Output(path, text.encode()) for path, text in texts.items()]


def _change_words(change: Change) -> str:
    """What a render did to one file: a checkout or copy that kept the content but dropped
    its mode (git stores no 0600) is only given its mode back, not "updated"."""
    path = change.output.path
    if change.old is None:
        return f"created {path}"
    if change.old == change.output.content:
        return f"set mode {change.output.mode:04o} on {path} (content unchanged)"
    return f"updated {path}"


@dataclass
class RenderResult:
    spec: Spec
    plan: Plan
    layout: SiteLayout
    changes: list[Change]
    new_passwords: list[NewPassword] = field(default_factory=list)  # to print, then forget
    removed_users: list[str] = field(default_factory=list)  # dropped from auth.users: removed
    warnings: list[str] = field(default_factory=list)
    recovered: str | None = None  # what finishing an interrupted render did
    written: bool = False

    def summary(self) -> list[str]:
        """What a render did: recovery, files, services, users removed, new passwords."""
        unshown = self.layout.new_passwords.relative_to(self.layout.root)
        lines = [self.recovered] if self.recovered else []
        lines += [_change_words(c) for c in self.changes
                  if c.output.path != unshown]  # passwords: printed below
        if not self.changes:
            lines.append(f"no change: {len(self.plan.services)} service(s) already rendered")
        for service in self.plan.services:
            seqs = service.max_num_seqs if service.max_num_seqs is not None else "vLLM default"
            lines.append(f"  {service.name}: GPUs {','.join(service.gpus)}, max_num_seqs {seqs} "
                         f"({service.max_num_seqs_reason})")
        lines += [f"removed user {user}: no longer in auth.users (refused with 401 once nginx "
                  "reloads: kit up)" for user in self.removed_users]
        lines += [
            f"password for {new.user}: {new.password}\n"
            "  (shown once; only its bcrypt hash is stored. Change it with kit rotate-password)"
            for new in self.new_passwords
        ]
        return lines

    def passwords_shown(self) -> None:
        """The summary was printed: the saved copy of its new passwords can go."""
        forget_shown_passwords(self.layout)

    def dry_run_report(self) -> list[str]:
        """The diff of every generated file; secret material only named, never shown."""
        lines = []
        for change in self.changes:
            if change.old == change.output.content:  # a checkout's mode: nothing to diff
                lines.append(f"would {_change_words(change)}")
            elif change.output.secret or not change.output.generated:
                verb = "create" if change.old is None else "update"
                lines.append(f"would {verb} {change.output.path} (secret material, not shown)")
            else:
                lines.append((change.diff or f"would create {change.output.path} (empty)\n")
                             .removesuffix("\n"))
        return lines or ["no change"]


def site_outputs(
    spec: Spec, layout: SiteLayout, spec_dir: Path, spec_name: str
) -> tuple[Plan, list[Output], AuthFiles]:
    """Every file of the site: generated config plus credential material."""
    check_budgets_counted(read_policies(layout), spec.usage.enabled)
    plan = build_plan(spec)
    outputs = generated_files(plan, spec_name)
    if spec.tls.mode == "self-signed":
        tls = self_signed_files(layout, spec.site, spec.domain)
    elif spec.tls.mode == "files":
        assert spec.tls.cert is not None and spec.tls.key is not None  # the spec checks it
        cert = spec.tls.cert if spec.tls.cert.is_absolute() else spec_dir / spec.tls.cert
        key = spec.tls.key if spec.tls.key.is_absolute() else spec_dir / spec.tls.key
        tls = user_files(cert, key, spec.domain)
    else:
        tls = acme_files(layout, spec.site, spec.domain)
    outputs += tls_outputs(layout, tls)
    if spec.tls.ca_bundle is not None:  # checked at spec load (kit/spec/model.py _ca_bundle)
        bundle = spec.tls.ca_bundle if spec.tls.ca_bundle.is_absolute() else (
            spec_dir / spec.tls.ca_bundle)
        outputs.append(Output(layout.ca_bundle.relative_to(layout.root), bundle.read_bytes(),
                              0o644, generated=False))
    if plan.observability is not None:
        alerts = plan.observability.alerts
        outputs += prometheus_auth_outputs(layout, alerting=alerts is not None)
        if alerts is not None:
            outputs += secret_outputs(alerts, layout, spec_dir)
    auth = auth_outputs(layout, spec.auth.users)
    return plan, outputs + auth.outputs, auth


def _unlisted(users: list[str]) -> list[str]:
    """Users in htpasswd that the spec never listed are kept, and said so on every render."""
    if not users:
        return []
    return [f"htpasswd also lets in {', '.join(users)}, not in auth.users (added with `kit users "
            "add`; render keeps them). Remove with: kit users remove USER, or list them in "
            "auth.users so that the spec owns them"]


def render_site(site: Site, *, force: bool = False, dry_run: bool = False) -> RenderResult:
    """The whole `kit render` of a loaded site (`dry_run`: compute the changes, write nothing)."""
    spec, spec_path, layout = site.spec, site.spec_path, site.layout
    # one writer per site (kit/site_lock.py; re-entered when the verb holds it already); a dry
    # run writes nothing and waits for no one
    with nullcontext() if dry_run else site_lock(layout.root, "render"):
        recovered = None if dry_run else recover(layout.root, layout.state_dir)
        plan, outputs, auth = site_outputs(spec, layout, spec_path.parent, spec_path.name)
        unshown = [] if dry_run else unshown_passwords(layout)
        if auth.new_passwords:
            outputs.append(unshown_passwords_output(layout, unshown + auth.new_passwords))
        changes = pending_changes(layout.root, outputs)
        result = RenderResult(
            spec, plan, layout, changes, unshown + auth.new_passwords, auth.removed,
            spec_warnings(spec, spec_path) + plan.warnings
            + _unlisted(auth.unlisted),
            recovered,
        )
        if dry_run:
            result.new_passwords = []  # nothing is written, so no password exists yet
            journal = interrupted(layout.state_dir)
            if journal is not None:
                result.warnings.append(f"a render did not finish ({journal}): the diff is "
                                       "against a half-updated site; kit render finishes it first")
            return result
        manifest = read_manifest(layout.manifest, force=force)
        edited = hand_edits(layout.root, changes, manifest)
        if edited and not force:
            raise BadInput(
                "these files were edited by hand since kit last wrote them:\n"
                + "\n".join(change.diff for change in edited),
                fix="move the change into the spec, or re-run with --force to overwrite "
                "(the diff above shows what would be lost: '-' lines are on disk now)",
            )
        remove_stale_temps(
            {(layout.root / output.path).parent for output in outputs} | {layout.state_dir}
        )
        commit(layout.root, layout.state_dir, changes, _new_manifest(layout, manifest, changes))
    result.written = bool(changes)
    return result


def _new_manifest(
    layout: SiteLayout, manifest: dict[str, str], changes: list[Change]
) -> bytes | None:
    """The manifest after `changes`, None when the one on disk already says it."""
    files = dict(manifest)
    for change in changes:
        if change.output.generated:
            files[str(change.output.path)] = digest(change.output.content)
    content = manifest_content(files)
    try:
        unchanged = layout.manifest.read_bytes() == content
    except OSError:
        unchanged = False
    return None if unchanged else content
