"""kit adapters add|remove|list: LoRA adapters hot-loaded on (or unloaded from) every replica of
a service, without a restart (docs/adapters.md)."""

from pathlib import Path

import click

from kit.commands.options import holding, wait_lock_option
from kit.engine.docker_api import connect
from kit.site import Site
from kit.stack.adapters import ADAPTER_DRAIN_S, adapter_table, add_adapter, remove_adapter

spec_path = click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))


@click.group("adapters")
def adapters_group() -> None:
    """LoRA adapters of a running service: load one on every replica and route it, stop routing
    and unload one, or list what each replica serves. The runtime routes are reached inside the
    replicas' containers, never through the front door."""


@adapters_group.command("add")
@spec_path
@click.argument("service")
@click.argument("name")
@click.option("--path", "path", required=True,
              help="A folder under models_root, or a Hub id org/name (as in adapters:).")
@click.option("--revision", help="A Hub adapter's commit or branch (its snapshot in hf_cache).")
@click.option("--sha256", help="The sha256 its weights file must have.")
@wait_lock_option
def add(spec: Path, service: str, name: str, path: str, revision: str | None,
        sha256: str | None, wait_lock: float) -> None:
    """Check adapter NAME as kit validate does, load it on every replica of SERVICE, gate each
    with a 1-token completion on it, then add it to SPEC (in place) and reload the front door:
    clients can ask for model NAME. Any replica failing: unloaded from all, nothing changed."""
    site = Site.load(spec)
    entry = {"name": name, "path": path, **({"revision": revision} if revision else {}),
             **({"sha256": sha256} if sha256 else {})}
    with holding(site.layout.root, "adapters add", wait_lock, (site.engine_url, site.project)):
        change = add_adapter(site, connect(site.engine_url), service, entry, report=click.echo)
    click.echo("\n".join(change.lines()))


@adapters_group.command("remove")
@spec_path
@click.argument("service")
@click.argument("name")
@click.option("--drain-timeout", type=click.FloatRange(min=0), default=ADAPTER_DRAIN_S,
              show_default=True, help="Seconds to wait for the requests on NAME already inside "
              "a replica's vLLM before unloading it there.")
@wait_lock_option
def remove(spec: Path, service: str, name: str, drain_timeout: float, wait_lock: float) -> None:
    """Take adapter NAME out of SPEC and the front door (requests for it get 404), wait for the
    requests on it already inside each replica's vLLM, then unload it from every running
    replica of SERVICE."""
    site = Site.load(spec)
    with holding(site.layout.root, "adapters remove", wait_lock,
                 (site.engine_url, site.project)):
        change = remove_adapter(site, connect(site.engine_url), service, name,
                                report=click.echo, drain_timeout=drain_timeout)
    click.echo("\n".join(change.lines()))


@adapters_group.command("list")
@spec_path
@click.argument("service", required=False)
def list_adapters(spec: Path, service: str | None) -> None:
    """Each running replica's adapters (of SERVICE, else of every service with adapters):
    loaded, or drift from SPEC (declared but not loaded, loaded but not declared)."""
    site = Site.load(spec, check_host=False)
    click.echo(adapter_table(site, connect(site.engine_url), service))


adapters = adapters_group
