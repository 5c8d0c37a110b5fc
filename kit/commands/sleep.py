"""kit sleep: put a service with idle_sleep to sleep now (every replica), through the engine."""

from pathlib import Path

import click

from kit.commands.options import holding, spec_argument, wait_lock_option
from kit.converge.sleep import change_sleep
from kit.engine.docker_api import connect
from kit.site import Site

HELP = {
    "sleep": "Put SERVICE of SPEC's site to sleep now: vLLM's sleep mode at its idle_sleep level "
             "(level 1 moves the weights to CPU memory and drops the KV cache; level 2 drops "
             "both), every replica.",
    "wake": "Wake SERVICE of SPEC's site now (every replica; at level 2 its weights are "
            "reloaded and its prefix cache reset).",
}


def sleep_verb(verb: str) -> click.Command:
    """`kit sleep` or `kit wake`: one core call, idempotent (a replica already so is left
    alone); exit 1 when a replica could not, 2 for a service without idle_sleep."""

    @click.command(name=verb, help=HELP[verb] + " A replica already so is left alone; exit 1 "
                   "when one could not, 2 when SERVICE has no idle_sleep. The routes are "
                   "reached inside the replica's container, never through the front door.")
    @spec_argument
    @click.argument("service")
    @wait_lock_option
    def command(spec: Path, service: str, wait_lock: float) -> None:
        site = Site.load(spec, check_host=False)
        with holding(site.layout.root, verb, wait_lock, (site.engine_url, site.project)):
            outcome = change_sleep(site, connect(site.engine_url), service, verb)
        click.echo("\n".join(outcome.lines()))

    return command


sleep = sleep_verb("sleep")
