"""What the pinned vLLM marks deprecated, and the `vllm serve` commands kit rendered into files.

Two sources of a deprecation, both of vLLM 0.33.0:
- the `vllm serve` flag list printed from vLLM's own parser (tests/standin/vllm-0.33.0-serve-
  flags.txt): an option is deprecated when its help text says one of its own names "is
  deprecated" or "will be removed" (e.g. `--mamba-cache-mode is deprecated and will be removed
  in v0.33.0.`); a help text that only mentions deprecated things (`--allow-deprecated-
  quantization`) marks nothing;
- vLLM's FlexibleArgumentParser (vllm/utils/argparse_utils.py), which the list cannot show: with
  `vllm serve` it rewrites `--model X` to the positional model and warns that "The `--model`
  option will be removed in a future version" (seen from vLLM 0.20 on).
"""

import re
from pathlib import Path

from kit.plan.build import VLLM_ENTRYPOINT
from kit.spec.vllm_flags import flag_table, flag_uses
from tests.support.sites import REPO

FLAG_LIST = REPO / "tests" / "standin" / "vllm-0.33.0-serve-flags.txt"
PARSER_DEPRECATED = {
    "--model": "vllm serve: `--model` is rewritten to the positional model with the warning "
               "\"The `--model` option will be removed in a future version.\"",
}


def deprecated_options(path: Path = FLAG_LIST) -> dict[str, str]:
    """{flag name: the help text that deprecates it}: every name of an option whose help says
    one of those names is deprecated or will be removed, plus the parser's own (`--model`)."""
    found = dict(PARSER_DEPRECATED)
    for line in path.read_text().splitlines():
        if not line.startswith("--"):
            continue  # comments and the positional model_tag
        names_text, _, rest = line.partition(" | ")
        names = [name.strip() for name in names_text.split(",")]
        help_text = rest.rsplit("] ", 1)[-1]
        said = re.findall(r"(-[-\w]+) (?:is deprecated|will be removed)", help_text)
        if any(name in names for name in said):
            found.update(dict.fromkeys(names, help_text))
    return found


def deprecated_in(argv: list[str], deprecated: dict[str, str]) -> list[str]:
    """The flags of a `vllm serve` argv (after the entrypoint) vLLM would warn about or refuse,
    each with why: split as vLLM's parser splits them (`--flag=value`, underscores, aliases)."""
    problems = []
    for use in flag_uses(argv, flag_table()):
        if not use.flag.startswith("-"):
            continue  # the positional model, or a flag's value
        if use.option is None:
            problems.append(f"{use.flag}: not a `vllm serve` flag of the pinned version")
            continue
        marked = [name for name in use.option.names if name in deprecated]
        if marked or use.flag in deprecated:
            problems.append(f"{use.flag}: {deprecated[(marked or [use.flag])[0]]}")
    return problems


def rendered_vllm_commands(document: dict) -> list[tuple[str, list[str]]]:
    """(where, argv after `vllm serve`) of every vLLM container in a compose file or a
    Kubernetes manifest (Deployment or LeaderWorkerSet), as the file runs it."""
    commands = []
    for name, body in (document.get("services") or {}).items():
        if body.get("entrypoint") == list(VLLM_ENTRYPOINT):
            commands.append((f"services.{name}", [str(a) for a in body.get("command") or []]))
    spec = document.get("spec") or {}
    templates = [spec.get("template")] if "template" in spec else []
    group = spec.get("leaderWorkerTemplate") or {}
    templates += [group.get("leaderTemplate"), group.get("workerTemplate")]
    for template in filter(None, templates):
        for container in template["spec"]["containers"]:
            if container.get("command") == list(VLLM_ENTRYPOINT):
                where = f"{document['kind']} {document['metadata']['name']}/{container['name']}"
                commands.append((where, [str(a) for a in container.get("args") or []]))
    return commands
