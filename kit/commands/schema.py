"""kit schema: the spec's JSON Schema, for editor completion of site.yaml."""

import json

import click

from kit.spec.model import Spec


@click.command()
def schema() -> None:
    """Print the JSON Schema of site.yaml (e.g. for the YAML language server)."""
    document = Spec.model_json_schema()
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    document["title"] = "kit site spec (site.yaml)"
    click.echo(json.dumps(document, indent=2, sort_keys=True))
