"""kit tls ca: where the site's local CA certificate is, for clients to trust."""

import click

from kit.commands.options import spec_argument
from kit.errors import BadInput
from kit.site import Site


@click.group("tls")
def tls_group() -> None:
    """TLS material of the front door."""


@tls_group.command("ca")
@spec_argument
def ca(spec) -> None:
    """Print the path of the kit CA certificate (self-signed mode): give it to your clients."""
    site = Site.load(spec)
    if site.spec.tls.mode != "self-signed":
        raise BadInput(f"tls.mode is {site.spec.tls.mode}: there is no kit CA",
                       fix="clients trust your certificate's issuer")
    path = site.layout.ca_cert
    if not path.is_file():
        raise BadInput(f"{path} does not exist yet", fix="run kit render first")
    click.echo(path.resolve())


tls = tls_group
