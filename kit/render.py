"""Plan → files. Templates hold the layout; every decision was made in the plan.

`render_site` is the whole `kit render`: validate, plan, compute every output, refuse to clobber
hand edits, then write atomically. Nothing is written when any step fails.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import jinja2

from kit import __version__
from kit.credentials import NewPassword, auth_outputs
from kit.errors import BadInput
from kit.files import (
    Change,
    Output,
    apply_changes,
    hand_edits,
    pending_changes,
    read_manifest,
    remove_stale_temps,
)
from kit.layout import NGINX_MOUNT, SiteLayout
from kit.plan import (
    AUTH_VERIFIER_PORT,
    HF_CACHE_MOUNT,
    MODELS_MOUNT,
    VLLM_PORT,
    Plan,
    build_plan,
)
from kit.site import Site
from kit.spec import Spec, spec_warnings
from kit.tls import acme_files, self_signed_files, tls_outputs, user_files


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


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(_template_source),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        bytecode_cache=_bytecode_cache(),
    )


def generated_files(plan: Plan, spec_name: str) -> list[Output]:
    """The files that are a pure function of the plan (committed as golden files)."""
    env = _environment()
    https = plan.nginx.https_port
    context = {
        "plan": plan,
        "n": plan.nginx,
        "spec_name": spec_name,
        "kit_version": __version__,
        "vllm_port": VLLM_PORT,
        "models_mount": MODELS_MOUNT,
        "hf_cache_mount": HF_CACHE_MOUNT,
        "nginx_mount": NGINX_MOUNT,
        "nginx_health_url": f"http://127.0.0.1:{AUTH_VERIFIER_PORT}/kit-healthz",
        "https_port_suffix": "" if https == 443 else f":{https}",
    }
    layout = SiteLayout(Path("."))
    return [
        Output(
            layout.compose_file,
            env.get_template("docker-compose.yml.j2").render(context).encode(),
        ),
        Output(layout.nginx_conf, env.get_template("nginx.conf.j2").render(context).encode()),
        Output(
            layout.nginx_dir / "kit.js",
            resources.files("kit.templates").joinpath("kit.js").read_bytes(),
        ),
    ]


@dataclass
class RenderResult:
    spec: Spec
    plan: Plan
    changes: list[Change]
    new_passwords: list[NewPassword] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    written: bool = False

    def summary(self) -> list[str]:
        """What a render wrote, per service, and each new password (shown this once)."""
        lines = [f"{'created' if c.old is None else 'updated'} {c.output.path}"
                 for c in self.changes]
        if not self.changes:
            lines.append(f"no change: {len(self.plan.services)} service(s) already rendered")
        for service in self.plan.services:
            seqs = service.max_num_seqs if service.max_num_seqs is not None else "vLLM default"
            lines.append(f"  {service.name}: GPUs {','.join(service.gpus)}, max_num_seqs {seqs} "
                         f"({service.max_num_seqs_reason})")
        lines += [
            f"password for {new.user}: {new.password}\n"
            "  (shown once; only its bcrypt hash is stored. Change it with kit rotate-password)"
            for new in self.new_passwords
        ]
        return lines

    def dry_run_report(self) -> list[str]:
        """The diff of every generated file; credential material only named, never shown."""
        lines = []
        for change in self.changes:
            if not change.output.generated:
                verb = "create" if change.old is None else "update"
                lines.append(f"would {verb} {change.output.path} (credential material, not shown)")
            else:
                lines.append((change.diff or f"would create {change.output.path} (empty)\n")
                             .removesuffix("\n"))
        return lines or ["no change"]


def site_outputs(spec: Spec, layout: SiteLayout, spec_dir: Path, spec_name: str):
    """Every file of the site: generated config plus credential material."""
    plan = build_plan(spec)
    outputs = generated_files(plan, spec_name)
    if spec.tls.mode == "self-signed":
        tls = self_signed_files(layout, spec.site, spec.domain)
    elif spec.tls.mode == "files":
        cert = spec.tls.cert if spec.tls.cert.is_absolute() else spec_dir / spec.tls.cert
        key = spec.tls.key if spec.tls.key.is_absolute() else spec_dir / spec.tls.key
        tls = user_files(cert, key, spec.domain)
    else:
        tls = acme_files(layout, spec.site, spec.domain)
    outputs += tls_outputs(layout, tls)
    auth, new_passwords = auth_outputs(layout, spec.auth.users)
    return plan, outputs + auth, new_passwords


def render_site(site: Site, *, force: bool = False, dry_run: bool = False) -> RenderResult:
    """The whole `kit render` of a loaded site (`dry_run`: compute the changes, write nothing)."""
    spec, layout = site.spec, site.layout
    plan, outputs, new_passwords = site_outputs(
        spec, layout, site.spec_path.parent, site.spec_path.name
    )
    changes = pending_changes(layout.root, outputs)
    result = RenderResult(spec, plan, changes, new_passwords, spec_warnings(spec) + plan.warnings)
    if dry_run:
        result.new_passwords = []  # nothing is written, so no password exists yet
        return result
    edited = hand_edits(layout.root, changes, read_manifest(layout.manifest))
    if edited and not force:
        raise BadInput(
            "these files were edited by hand since kit last wrote them:\n"
            + "\n".join(change.diff for change in edited),
            fix="move the change into the spec, or re-run with --force to overwrite "
            "(the diff above shows what would be lost: '-' lines are on disk now)",
        )
    layout.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    remove_stale_temps(layout.root, outputs)
    apply_changes(layout.root, changes, layout.manifest)
    result.written = bool(changes)
    return result
