"""`vllm` command line: a real argparse parser built from vLLM 0.33.0's `vllm serve` option list.

vllm-0.33.0-serve-flags.txt (beside this package) was printed from vLLM's own parser; every option,
alias, choice list, nargs and boolean pair is rebuilt from it. The argument rewriting of vLLM's
FlexibleArgumentParser is reproduced: `--model X` moves to the positional model tag (with vLLM's
warning that `--model` will be removed), so a positional model as well is an unrecognized
argument; --served-model-name without a model first is vLLM's ValueError; underscores in option
names become dashes, `--x.y.z v` merges into a JSON value for `--x`, `-O3` means
`--optimization-level 3`. Other errors go through argparse, so messages and exit code 2 are
argparse's.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from . import VERSION, logs

FLAGS_FILE = Path(__file__).resolve().parent.parent / "vllm-0.33.0-serve-flags.txt"

# vllm/entrypoints/cli/_utils.py: the sub-commands of `vllm` (only `serve` is imitated).
CLI_COMMANDS = ("chat", "complete", "serve", "launch", "bench", "collect-env", "run-batch")
SERVE_USAGE = "vllm serve [model_tag] [options]"


class ParseFailure(Exception):
    """An exception vLLM's parser raises uncaught (a traceback, exit 1), not an argparse error:
    `error` is what Python prints last (`ValueError: …`)."""

    def __init__(self, error: str):
        super().__init__(error)
        self.error = error


class ModelNotFirst(ValueError):
    """vLLM's parser raises this ValueError (not an argparse error: a traceback, exit 1) when
    `vllm serve` has --served-model-name but no positional model first (and no --config)."""

    def __init__(self):
        super().__init__(
            "`model` should be provided as the first positional argument when using `vllm "
            "serve`. i.e. `vllm serve <model> --<arg> <value>`."
        )


@dataclass(frozen=True)
class FlagSpec:
    names: tuple[str, ...]
    default: object
    bool_flag: bool
    type_name: str | None
    choices: tuple | None
    nargs: str | None
    repeatable: bool
    group: str
    help: str


class Opaque:
    """A default printed as an enum or dataclass repr: kept as text, never parsed."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _default(text: str) -> object:
    if text == "'SUPPRESS'":
        return argparse.SUPPRESS
    if text == "set()":
        return set()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return Opaque(text)


def load_flag_specs(path: Path = FLAGS_FILE) -> list[FlagSpec]:
    specs = []
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        names, default, kind, rest = line.split(" | ", 3)
        group, _, help_text = rest.partition("] ")
        choices = None
        match = re.search(r"choices=\{([^}]*)\}", kind)
        tokens = re.sub(r"choices=\{[^}]*\}", "", kind).split()
        type_name = next((t[5:] for t in tokens if t.startswith("type=")), None)
        if match and not match.group(1).endswith("..."):  # a truncated list restricts nothing
            raw = match.group(1).split(",")
            choices = tuple(
                None if c == "None" else int(c) if type_name == "int" else c for c in raw
            )
        specs.append(
            FlagSpec(
                names=tuple(n.strip() for n in names.replace(" (positional)", "").split(",")),
                default=_default(default.removeprefix("default=")),
                bool_flag="bool-flag" in tokens,
                type_name=type_name,
                choices=choices,
                nargs=next((t[6:] for t in tokens if t.startswith("nargs=")), None),
                repeatable="repeatable" in tokens,
                group=group.lstrip("["),
                help=help_text,
            )
        )
    return specs


# Value parsers named like vLLM's, so argparse's "invalid <name> value" messages match.
def human_readable_int(value: str) -> int:
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
        if suffix in decimal:
            return int(float(number) * decimal[suffix])
        try:
            return int(number) * {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]
        except ValueError as e:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. "
                f"Did you mean to use {number}{suffix.lower()} instead?"
            ) from e
    return int(value)


def human_readable_int_or_auto(value: str) -> int:
    value = value.strip()
    if value == "-1" or value.lower() == "auto":
        return -1
    return human_readable_int(value)


def loads(value: str) -> object:
    return json.loads(value)


def union_dict_and_str(value: str) -> object:
    if not re.match(r"(?s)^\s*{.*}\s*$", value):
        return value
    return json.loads(value)


def _json_config(value: str) -> object:
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"Failed to parse '{value}' as JSON: {e}") from e


def parse_dataclass(value: str) -> object:
    return _json_config(value)


def _parse_type(value: str) -> object:
    return _json_config(value)


def parse_reasoning_parser(value: str) -> str:
    return value


TYPES = {
    "int": int,
    "float": float,
    "str": str,
    "loads": loads,
    "human_readable_int": human_readable_int,
    "human_readable_int_or_auto": human_readable_int_or_auto,
    "union_dict_and_str": union_dict_and_str,
    "parse_dataclass": parse_dataclass,
    "_parse_type": _parse_type,
    "parse_reasoning_parser": parse_reasoning_parser,
    "<lambda>": lambda value: value,
}


def _dest(spec: FlagSpec) -> str:
    return spec.names[0].lstrip("-").replace("-", "_")


def add_serve_flags(parser: argparse.ArgumentParser, specs: list[FlagSpec]) -> None:
    groups: dict[str, argparse._ArgumentGroup] = {}
    for spec in specs:
        if spec.names == ("model_tag",):
            parser.add_argument("model_tag", type=str, nargs="?", default=None, help=spec.help)
            continue
        group = groups.get(spec.group)
        if group is None:
            group = groups[spec.group] = parser.add_argument_group(spec.group)
        dest = _dest(spec)
        if spec.bool_flag:
            # The first long name and the short aliases set True, the other long name False.
            negative = [n for n in spec.names[1:] if n.startswith("--")]
            positive = [n for n in spec.names if n not in negative]
            group.add_argument(
                *positive,
                dest=dest,
                action="store_const",
                const=True,
                default=spec.default,
                help=spec.help,
            )
            if negative:
                group.add_argument(
                    *negative,
                    dest=dest,
                    action="store_const",
                    const=False,
                    default=spec.default,
                    help=argparse.SUPPRESS,
                )
            continue
        kwargs: dict[str, object] = {"dest": dest, "default": spec.default, "help": spec.help}
        kwargs["type"] = TYPES[spec.type_name] if spec.type_name else str
        if spec.choices is not None:
            kwargs["choices"] = spec.choices
        if spec.repeatable:
            kwargs["action"] = "append"
        elif spec.nargs:
            kwargs["nargs"] = spec.nargs
        group.add_argument(*spec.names, **kwargs)


class FlexibleArgumentParser(argparse.ArgumentParser):
    """argparse with vLLM's FlexibleArgumentParser rewriting (vllm/utils/argparse_utils.py)."""

    def error(self, message: str):  # noqa: D401 - argparse API
        if (
            self.prog.endswith(" serve")
            and message.startswith("unrecognized arguments:")
            and re.search(r"(^|\s)--task(=|\s|$)", message)
        ):
            message += (
                "\n\nHint: --task is not a vllm serve option. For embedding, reranking, or "
                "reward models, use --runner pooling. To adapt a generative model for pooling, "
                "also use --convert embed, --convert classify, or --convert reward."
            )
        super().error(message)

    def parse_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        if args[:1] == ["serve"]:
            args = self._move_model_option(args)
            if (
                len(args) > 1
                and args[1].startswith("-")
                and not any(re.match(r"^--config(=.+|$)", a) for a in args)
                and any(re.match(r"^--served[-_]model[-_]name(=.+|$)", a) for a in args)
            ):
                raise ModelNotFirst()
        if "--config" in args:  # vLLM matches the exact word: `--config=FILE` is not read
            args = self._pull_args_from_config(args)
        return super().parse_args(self._rewrite(args), namespace)

    def _pull_args_from_config(self, args: list[str]) -> list[str]:
        """vLLM's `--config FILE`: the file's options put after the sub-command and the
        positional model, before the command line's other options, so the command line wins
        (argparse keeps the last value) and the file wins over the defaults."""
        if args.count("--config") > 1:  # vLLM: an assert
            raise ParseFailure("AssertionError: More than one config file specified!")
        index = args.index("--config")
        if index == len(args) - 1:
            raise ParseFailure("ValueError: No config file specified! Please check your "
                               "command-line arguments.")
        config_args = self.load_config_file(args[index + 1])
        rest = args[index + 2:]
        if args[0].startswith("-"):
            return config_args + args[:index] + rest
        if args[0] == "serve":
            model_in_cli = len(args) > 1 and not args[1].startswith("-")
            if not model_in_cli and "--model" not in config_args:
                raise ParseFailure("ValueError: No model specified! Please specify model either "
                                   "as a positional argument or in a config file.")
            cut = 2 if model_in_cli else 1
            return args[:cut] + config_args + args[cut:index] + rest
        return [args[0]] + config_args + args[1:index] + rest

    def load_config_file(self, file_path: str) -> list[str]:
        """vLLM's reading of the file: YAML (`.yaml`/`.yml` only) by yaml.safe_load, each key
        `--key value`; true → `--key`, false → `--no-key` when the parser has it; a list →
        `--key item…` (nothing when empty); a mapping → `--key <JSON>`; other values by str()."""
        extension = file_path.split(".")[-1]
        if extension not in ("yaml", "yml"):
            raise ParseFailure(f"ValueError: Config file must be of a yaml/yml type. "
                               f"{extension} supplied")
        import yaml  # only here: the stand-in is stdlib-only unless --config is used

        try:
            with open(file_path) as config_file:
                config = yaml.safe_load(config_file)
        except Exception as ex:
            logs.plain_line("ERROR", "argparse_utils.py:538", f"Unable to read the config file "
                            f"at {file_path}. Check path correctness")
            raise ParseFailure(f"{type(ex).__name__}: {ex}") from ex
        if not isinstance(config, dict):  # vLLM calls config.items(): an AttributeError
            raise ParseFailure(f"AttributeError: '{type(config).__name__}' object has no "
                               "attribute 'items'")
        processed: list[str] = []
        for key, value in config.items():
            if isinstance(value, bool):
                if value:
                    processed.append("--" + key)
                elif (no_key := f"--no-{key}") in self._option_string_actions:
                    processed.append(no_key)
            elif isinstance(value, list):
                if value:
                    processed += ["--" + key, *(str(item) for item in value)]
            elif isinstance(value, dict):
                processed += ["--" + key, json.dumps(value)]
            else:
                processed += ["--" + key, str(value)]
        return processed

    def _move_model_option(self, args: list[str]) -> list[str]:
        idx = next((i for i, a in enumerate(args) if re.match(r"^--model(=.+|$)", a)), None)
        if idx is None:
            return args
        warn(
            "With `vllm serve`, you should provide the model as a positional argument or in a "
            "config file instead of via the `--model` option. The `--model` option will be "
            "removed in a future version."
        )
        if args[idx] == "--model":
            if idx + 1 >= len(args) or args[idx + 1].startswith("-"):
                self.error("argument --model: expected one argument")
            tag, rest = args[idx + 1], idx + 2
        else:
            tag, rest = args[idx].removeprefix("--model="), idx + 1
        return ["serve", tag, *args[1:idx], *args[rest:]]

    @staticmethod
    def _rewrite(args: list[str]) -> list[str]:
        head = re.compile(r"(?<=--)[^\.]*")  # between the leading -- and the first dot

        def dashes(match: re.Match) -> str:
            return match.group(0).replace("_", "-")

        out: list[str] = []
        for i, arg in enumerate(args):
            if arg.startswith("--"):
                key, eq, value = arg.partition("=")
                out.append(head.sub(dashes, key, count=1) + eq + value)
            elif arg.startswith("-O") and arg != "-O":
                out += ["--optimization-level", arg[3:] if arg[2:3] == "=" else arg[2:]]
            elif arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
                out.append("--optimization-level")
            else:
                out.append(arg)
        # --x.y.z value (or --x.y=value): merged into one JSON object for --x.
        merged: dict[str, dict] = {}
        result: list[str] = []
        skip = False
        for i, arg in enumerate(out):
            if skip:
                skip = False
                continue
            key, eq, value = arg.partition("=")
            if arg.startswith("-") and "." in key:
                if not eq:
                    if i + 1 >= len(out):
                        result.append(arg)
                        continue
                    value, skip = out[i + 1], True
                if key.endswith("+"):
                    key, value = key[:-1], json.dumps(value.split(","))
                name, *path = key.split(".")
                try:
                    parsed = json.loads(value)
                except json.JSONDecodeError:
                    try:
                        parsed = human_readable_int(value)
                    except (ValueError, argparse.ArgumentTypeError):
                        parsed = value
                node = merged.setdefault(name, {})
                for part in path[:-1]:
                    node = node.setdefault(part, {})
                node[path[-1]] = parsed
                continue
            result.append(arg)
        for name, value in merged.items():
            result += [name, json.dumps(value)]
        return result


def warn(message: str) -> None:
    """A vLLM warning logged before the API server's log prefix is set up."""
    logs.plain_line("WARNING", "argparse_utils.py:312", message)


def build_parser(specs: list[FlagSpec] | None = None) -> FlexibleArgumentParser:
    parser = FlexibleArgumentParser(prog="main.py", description="vLLM CLI")
    parser.add_argument("-v", "--version", action="version", version=VERSION)
    sub = parser.add_subparsers(required=False, dest="subparser")
    for name in CLI_COMMANDS:
        if name == "serve":
            serve = sub.add_parser(
                "serve",
                usage=SERVE_USAGE,
                help="Launch a local OpenAI-compatible API server to serve LLM completions "
                "via HTTP.",
            )
            add_serve_flags(serve, specs if specs is not None else load_flag_specs())
        else:
            sub.add_parser(name, add_help=False)
    return parser


def non_default_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    """The `non-default args: {...}` dict vLLM logs, in the parser's option order."""
    serve = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "serve"
    ]
    out: dict[str, object] = {}
    for action in serve._actions:
        dest = action.dest
        if dest in ("help", "subparser") or dest in out or not hasattr(args, dest):
            continue
        if getattr(args, dest) != action.default:
            out[dest] = getattr(args, dest)
    return out
