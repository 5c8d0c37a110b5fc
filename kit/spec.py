"""The site spec: what the operator wrote in site.yaml, validated, with file:line:col errors.

Validation happens in three passes, all before anything is written:
1. YAML → Python with the position of every key recorded (duplicate keys refused here);
2. pydantic field rules (types, ranges, patterns, unknown keys with "did you mean");
3. checks across fields and against the host (GPU sharing, ports, vLLM flags, TLS files,
   model directories).
Every problem is reported, not only the first.
"""

import difflib
import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from kit.errors import BadInput
from kit.vllm_flags import SHIPPED_VERSION, check_extra_args, flag_table, image_version

DEFAULT_SPEC = Path("site.yaml")
GPU_SHARE_LIMIT = 0.95

# Values land in YAML, nginx and shell-free argv lists; these patterns keep every one of them
# inside its place (no quotes, braces, semicolons, `$`, whitespace or newlines).
SITE_NAME = r"^[a-z][a-z0-9-]{0,30}$"
SERVICE_NAME = r"^[a-z][a-z0-9-]{0,40}$"
SERVED_NAME = r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}$"
MODEL_REF = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$"
USER_NAME = r"^[a-z][a-z0-9._-]{0,31}$"
IMAGE_REF = r"^[a-z0-9][a-z0-9._/:-]*(@sha256:[a-f0-9]{64})?$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
SIZE = r"^[1-9][0-9]{0,5}[kmg]?$"
HOSTNAME_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
SAFE_TEXT = re.compile(r"^[^\s\"'`$;{}\\]+$")
RESERVED_USERS = {"kit-probe"}
# Compose services kit renders itself, beside the spec's ones.
RESERVED_SERVICES = {
    "nginx": "the front door",
    "certbot": "the ACME client (tls.mode acme)",
    "kit-auth": "the front door's password verifier",
}


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class Images(StrictModel):
    vllm: Annotated[str, Field(pattern=IMAGE_REF)] = f"vllm/vllm-openai:v{SHIPPED_VERSION}"
    nginx: Annotated[str, Field(pattern=IMAGE_REF)] = "nginx:1.27-alpine"
    certbot: Annotated[str, Field(pattern=IMAGE_REF)] = "certbot/certbot:v3.1.0"  # acme mode


class TLS(StrictModel):
    mode: Literal["self-signed", "files", "acme"] = "self-signed"
    cert: Path | None = None  # files mode: PEM certificate (chain) path, relative to the spec
    key: Path | None = None  # files mode: PEM private key path
    email: str | None = None  # acme mode: the account e-mail
    acme_server: Annotated[str, Field(pattern=r"^https://[A-Za-z0-9.:/_-]+$")] | None = None
    staging: bool = False  # acme mode: Let's Encrypt's staging CA (untrusted certs, high limits)

    @model_validator(mode="after")
    def _mode_needs(self) -> "TLS":
        if self.mode == "files" and (self.cert is None or self.key is None):
            raise ValueError("tls.mode files needs both tls.cert and tls.key")
        if self.mode == "acme" and not self.email:
            raise ValueError("tls.mode acme needs tls.email (the ACME account address)")
        if self.mode != "files" and (self.cert or self.key):
            raise ValueError(f"tls.cert/tls.key are only read in mode files, not {self.mode}")
        if self.mode != "acme" and (self.acme_server or self.staging):
            raise ValueError(
                f"tls.acme_server/tls.staging are only read in mode acme, not {self.mode}"
            )
        address = r"[^@\s\"';{}$]+@[^@\s\"';{}$]+"
        if self.email is not None and not re.fullmatch(address, self.email):
            raise ValueError(f"tls.email {self.email!r} is not an e-mail address")
        return self


class Auth(StrictModel):
    users: list[Annotated[str, Field(pattern=USER_NAME)]] = []
    api_keys: bool = True

    @field_validator("users")
    @classmethod
    def _users_unique(cls, users: list[str]) -> list[str]:
        reserved = RESERVED_USERS.intersection(users)
        if reserved:
            raise ValueError(f"{', '.join(sorted(reserved))} is kit's own probe identity")
        dupes = sorted({u for u in users if users.count(u) > 1})
        if dupes:
            raise ValueError(f"duplicate user {', '.join(dupes)}")
        return users


class Proxy(StrictModel):
    bind: str = "0.0.0.0"
    https_port: Annotated[int, Field(ge=1, le=65535)] = 443
    http_port: Annotated[int, Field(ge=1, le=65535)] = 80
    max_body: Annotated[str, Field(pattern=SIZE)] = "1m"
    read_timeout: Annotated[int, Field(ge=1, le=86400)] = 900  # seconds; long generations
    connect_timeout: Annotated[int, Field(ge=1, le=300)] = 10
    # auto: derived from the services' concurrency (kit/plan.py, docs/auth.md "Limits")
    rate_limit_per_ip: Annotated[int, Field(ge=1, le=1000000)] | Literal["auto"] = "auto"
    rate_limit_per_credential: Annotated[int, Field(ge=1, le=1000000)] | Literal["auto"] = "auto"
    failed_logins_per_ip: Annotated[int, Field(ge=1, le=10000)] = 20  # per minute
    max_connections_per_ip: Annotated[int, Field(ge=1, le=65535)] | Literal["auto"] = "auto"

    @field_validator("bind")
    @classmethod
    def _bind_is_ip(cls, bind: str) -> str:
        try:
            return str(ipaddress.ip_address(bind))
        except ValueError:
            raise ValueError(f"proxy.bind {bind!r} is not an IP address (e.g. 0.0.0.0)") from None

    @model_validator(mode="after")
    def _ports_differ(self) -> "Proxy":
        if self.https_port == self.http_port:
            raise ValueError(f"https_port and http_port are both {self.http_port}")
        return self


class Service(StrictModel):
    name: Annotated[str, Field(pattern=SERVICE_NAME)]
    model: Annotated[str, Field(pattern=MODEL_REF, max_length=200)]
    served_name: Annotated[str, Field(pattern=SERVED_NAME)] | None = None
    gpus: Annotated[list[Annotated[int, Field(ge=0, le=63)]], Field(min_length=1)]
    tensor_parallel: Annotated[int, Field(ge=1, le=64)] | None = None
    max_model_len: Annotated[int, Field(gt=0, le=16_777_216)] = 8192
    max_num_seqs: Annotated[int, Field(ge=1, le=65536)] | Literal["auto"] = "auto"
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.90
    dtype: Literal["auto", "bfloat16", "float16", "half", "float", "float32"] = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    trust_remote_code: bool = False
    extra_args: list[Annotated[str, Field(pattern=r"^[^\n\r$]*$", max_length=4096)]] = []
    env: dict[
        Annotated[str, Field(pattern=ENV_NAME)],
        Annotated[str, Field(pattern=r"^[^\n\r$]*$", max_length=4096)],
    ] = {}
    startup_timeout: Annotated[int, Field(ge=30, le=86400)] | None = None  # seconds

    @field_validator("gpus")
    @classmethod
    def _gpus_unique(cls, gpus: list[int]) -> list[int]:
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"GPU index listed twice in {gpus}")
        return gpus

    @field_validator("quantization")
    @classmethod
    def _known_quantization(cls, value: str | None) -> str | None:
        return _one_of(value, "--quantization")

    @field_validator("kv_cache_dtype")
    @classmethod
    def _known_kv_dtype(cls, value: str) -> str:
        return _one_of(value, "--kv-cache-dtype")

    @model_validator(mode="after")
    def _tp_matches_gpus(self) -> "Service":
        if self.tensor_parallel is not None and self.tensor_parallel != len(self.gpus):
            raise ValueError(
                f"tensor_parallel is {self.tensor_parallel} but gpus lists {len(self.gpus)} "
                f"GPU(s); kit runs one tensor-parallel group per service, so they must match"
            )
        return self

    @property
    def tp(self) -> int:
        return self.tensor_parallel or len(self.gpus)

    @property
    def api_name(self) -> str:
        return self.served_name or self.name


def _one_of(value: str | None, flag: str) -> str | None:
    option = flag_table().lookup(flag)
    if value is not None and option and option.choices and value not in option.choices:
        hint = difflib.get_close_matches(value, option.choices, n=1)
        did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ValueError(
            f"{value!r} is not a {flag} value of vLLM {SHIPPED_VERSION}{did_you_mean}; "
            f"valid: {', '.join(option.choices)}"
        )
    return value


class Spec(StrictModel):
    site: Annotated[str, Field(pattern=SITE_NAME)]
    domain: str
    images: Images = Images()
    models_root: Path
    hf_cache: Path | None = None
    gpu_memory_gib: (
        Annotated[float, Field(gt=0, le=4096)]
        | dict[Annotated[int, Field(ge=0, le=63)], Annotated[float, Field(gt=0, le=4096)]]
        | None
    ) = None
    tls: TLS = TLS()
    auth: Auth = Auth()
    proxy: Proxy = Proxy()
    healthcheck_interval: Annotated[int, Field(ge=1, le=300)] = 10  # seconds
    services: Annotated[list[Service], Field(min_length=1)]

    @field_validator("domain")
    @classmethod
    def _domain_is_host(cls, domain: str) -> str:
        try:
            return str(ipaddress.ip_address(domain))
        except ValueError:
            pass
        name = domain.lower().rstrip(".")
        labels = name.split(".")
        if len(name) > 253 or not all(HOSTNAME_LABEL.match(label) for label in labels):
            raise ValueError(f"{domain!r} is not a DNS name or IP address (e.g. llm.example.com)")
        return name

    @field_validator("models_root", "hf_cache")
    @classmethod
    def _absolute_safe_path(cls, path: Path | None) -> Path | None:
        if path is None:
            return None
        if not path.is_absolute():
            raise ValueError(f"{str(path)!r} must be an absolute host path (e.g. /data/models)")
        if not SAFE_TEXT.match(str(path)) or ":" in str(path) or "," in str(path):
            raise ValueError(f"{str(path)!r} has spaces, quotes, ':' ',' '$' ';' or braces")
        return path

    def service(self, name: str) -> Service:
        for service in self.services:
            if service.name == name:
                return service
        raise KeyError(name)

    def gpu_memory_for(self, gpu: int) -> float | None:
        if isinstance(self.gpu_memory_gib, dict):
            return self.gpu_memory_gib.get(gpu)
        return self.gpu_memory_gib


# --------------------------------------------------------------------------- YAML with positions


@dataclass
class Located:
    """A parsed document plus the (line, column) of every key path in it (1-based)."""

    data: Any
    marks: dict[tuple, tuple[int, int]] = field(default_factory=dict)
    problems: list[tuple[tuple, str]] = field(default_factory=list)

    def position(self, path: tuple) -> tuple[int, int]:
        while path and path not in self.marks:
            path = path[:-1]
        return self.marks.get(path, (1, 1))


def parse_yaml(text: str) -> Located:
    """YAML → plain data, remembering where each key is and refusing duplicate keys."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
    finally:
        loader.dispose()
    located = Located(data=None)
    if root is not None:
        located.data = _walk(root, (), located, loader)
    return located


def _walk(node: yaml.Node, path: tuple, located: Located, loader: yaml.SafeLoader) -> Any:
    located.marks.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
    if isinstance(node, yaml.MappingNode):
        result: dict = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str | int | float | bool) or key is None:
                located.problems.append((path, "keys must be plain scalars"))
                continue
            child = (*path, key)
            located.marks[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if key in result:
                located.problems.append((child, f"duplicate key {key!r}"))
                continue
            result[key] = _walk(value_node, child, located, loader)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, (*path, i), located, loader) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


# --------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class SpecProblem:
    path: tuple
    message: str
    fix: str | None = None


class SpecError(BadInput):
    """All problems of one spec, each as `file:line:col: key.path: message`."""

    def __init__(self, source: Path, located: Located | None, problems: list[SpecProblem]):
        self.problems = problems
        lines = []
        for problem in problems:
            line, column = located.position(problem.path) if located else (1, 1)
            where = f"{source}:{line}:{column}"
            key = dotted(problem.path)
            text = f"{where}: {key}: {problem.message}" if key else f"{where}: {problem.message}"
            if problem.fix:
                text += f"\n    fix: {problem.fix}"
            lines.append(text)
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"{source}: {len(problems)} {noun}:\n" + "\n".join(lines))


def dotted(path: tuple) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def load_spec(path: Path, *, check_host: bool = True) -> Spec:
    """Read and validate a spec file; raise SpecError listing every problem found."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BadInput(
            f"spec file {path} does not exist",
            fix="pass the spec path (kit render path/to/site.yaml) or create one with `kit init`",
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise BadInput(f"cannot read spec file {path}: {error}") from None
    return parse_spec(text, path, check_host=check_host)


def parse_spec(text: str, source: Path, *, check_host: bool = True) -> Spec:
    try:
        located = parse_yaml(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise BadInput(
            f"{source}:{line}:{column}: invalid YAML: {error.problem or error}",
            fix="fix the YAML syntax at that position (indentation, a missing ':' or quote)",
        ) from None
    except yaml.YAMLError as error:
        raise BadInput(f"{source}: invalid YAML: {error}") from None
    problems = [SpecProblem(path, message) for path, message in located.problems]
    if not isinstance(located.data, dict):
        problems.append(SpecProblem((), "the spec must be a mapping (site:, domain:, services:)"))
        raise SpecError(source, located, problems)
    if problems:
        raise SpecError(source, located, problems)
    try:
        spec = Spec.model_validate(located.data)
    except ValidationError as error:
        raise SpecError(source, located, [_from_pydantic(e) for e in error.errors()]) from None
    problems = cross_checks(spec, spec_dir=source.parent, check_host=check_host)
    if problems:
        raise SpecError(source, located, problems)
    return spec


def _from_pydantic(error: dict) -> SpecProblem:
    path = tuple(part for part in error["loc"] if not _is_union_tag(part))
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(path[:-1])
        hint = difflib.get_close_matches(str(path[-1]), allowed, n=1, cutoff=0.6)
        fix = f"did you mean {hint[0]!r}?" if hint else f"known keys: {', '.join(allowed)}"
        return SpecProblem(path, f"unknown key {path[-1]!r}", fix)
    if kind == "missing":
        return SpecProblem(path, "required key is missing", f"add {dotted(path)}: to the spec")
    message = error["msg"].removeprefix("Value error, ")
    if kind == "string_pattern_mismatch":
        value = error.get("input")
        message = f"{value!r} has characters that are not allowed here ({_pattern_hint(path)})"
    elif "input" in error and kind not in ("value_error",) and not isinstance(error["input"], dict):
        message = f"{message} (got {error['input']!r})"
    return SpecProblem(path, message)


def _is_union_tag(part: Any) -> bool:
    """pydantic puts union member names (e.g. 'int', 'literal['auto']') into error locations."""
    return isinstance(part, str) and ("[" in part or part in ("int", "float", "str", "dict"))


def _pattern_hint(path: tuple) -> str:
    hints = {
        "site": "lower-case letters, digits and '-', starting with a letter, at most 31",
        "name": "lower-case letters, digits and '-', starting with a letter",
        "users": "lower-case letters, digits, '.', '_' and '-', starting with a letter",
        "served_name": "letters, digits and . _ / : -",
        "model": "a directory name under models_root or an org/name Hugging Face id",
        "vllm": "an image reference like vllm/vllm-openai:v0.33.0",
        "nginx": "an image reference like nginx:1.27-alpine",
        "max_body": "a size like 1m, 512k or 2g",
        "extra_args": "no newlines and no '$'",
        "env": "names: letters, digits, '_'; values: no newlines and no '$'",
    }
    for part in reversed(path):
        if part in hints:
            return hints[part]
    return "see `kit schema`"


def _allowed_keys(path: tuple) -> list[str]:
    model: Any = Spec
    for part in path:
        if isinstance(part, int):
            continue
        annotation = model.model_fields[part].annotation
        model = _model_in(annotation)
        if model is None:
            return []
    return list(model.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found:
            return found
    return None


# --------------------------------------------------------------------------- checks across fields


def cross_checks(spec: Spec, *, spec_dir: Path, check_host: bool) -> list[SpecProblem]:
    problems: list[SpecProblem] = []
    problems += _unique_names(spec)
    problems += _gpu_sharing(spec)
    problems += _extra_args(spec)
    problems += _tls_files(spec, spec_dir)
    if check_host:
        problems += _model_dirs(spec)
    return problems


def _unique_names(spec: Spec) -> list[SpecProblem]:
    problems = []
    seen_names: dict[str, int] = {}
    seen_served: dict[str, int] = {}
    for i, service in enumerate(spec.services):
        if service.name in RESERVED_SERVICES:
            problems.append(SpecProblem(
                ("services", i, "name"),
                f"{service.name!r} is {RESERVED_SERVICES[service.name]}", "choose another name",
            ))
        if service.name in seen_names:
            problems.append(SpecProblem(
                ("services", i, "name"),
                f"duplicate service name {service.name!r} "
                f"(also services[{seen_names[service.name]}])",
            ))
        seen_names.setdefault(service.name, i)
        if service.api_name in seen_served:
            problems.append(SpecProblem(
                ("services", i, "served_name"),
                f"duplicate served name {service.api_name!r} "
                f"(also services[{seen_served[service.api_name]}]); clients pick a model by it",
            ))
        seen_served.setdefault(service.api_name, i)
    return problems


def _gpu_sharing(spec: Spec) -> list[SpecProblem]:
    share: dict[int, list[int]] = {}
    for i, service in enumerate(spec.services):
        for gpu in service.gpus:
            share.setdefault(gpu, []).append(i)
    problems = []
    for gpu, users in sorted(share.items()):
        total = sum(spec.services[i].gpu_memory_utilization for i in users)
        if len(users) > 1 and total > GPU_SHARE_LIMIT + 1e-9:
            names = ", ".join(spec.services[i].name for i in users)
            problems.append(SpecProblem(
                ("services", users[-1], "gpus"),
                f"GPU {gpu} is shared by {names} whose gpu_memory_utilization adds up to "
                f"{total:.2f} (> {GPU_SHARE_LIMIT}); vLLM would fail to allocate at start",
                "lower gpu_memory_utilization of the services sharing it, or move one elsewhere",
            ))
    return problems


def _extra_args(spec: Spec) -> list[SpecProblem]:
    table = flag_table()
    return [
        SpecProblem(("services", i, "extra_args", index), message)
        for i, service in enumerate(spec.services)
        for index, message in check_extra_args(service.extra_args, table)
    ]


def spec_warnings(spec: Spec) -> list[str]:
    """Things that are allowed but worth saying before start-up."""
    warnings = []
    version = image_version(spec.images.vllm)
    if version != SHIPPED_VERSION:
        warnings.append(
            f"images.vllm {spec.images.vllm!r} is not vLLM {SHIPPED_VERSION}: extra_args were "
            f"checked against the {SHIPPED_VERSION} flag list, the newest kit knows"
        )
    if not spec.auth.users and not spec.auth.api_keys:
        warnings.append("auth has no users and api_keys is off: only kit's probe can get in")
    return warnings


def _tls_files(spec: Spec, spec_dir: Path) -> list[SpecProblem]:
    if spec.tls.mode != "files":
        return []
    problems = []
    for key in ("cert", "key"):
        value = getattr(spec.tls, key)
        path = value if value.is_absolute() else spec_dir / value
        if not path.is_file():
            problems.append(SpecProblem(
                ("tls", key), f"file {path} does not exist",
                f"point tls.{key} at your PEM {key} file (paths are relative to the spec)",
            ))
    return problems


def _model_dirs(spec: Spec) -> list[SpecProblem]:
    """Checks that need the model directory on this host (skipped when it is elsewhere)."""
    problems = []
    for i, service in enumerate(spec.services):
        model_dir = spec.models_root / service.model
        if "/" in service.model and not model_dir.exists():
            continue  # a Hugging Face id: vLLM downloads it
        if not spec.models_root.is_dir():
            continue  # rendering away from the GPU server: nothing to check here
        if not model_dir.is_dir():
            problems.append(SpecProblem(
                ("services", i, "model"),
                f"model directory {model_dir} does not exist",
                f"put the model under {spec.models_root} or set model to an org/name Hub id",
            ))
            continue
        if not (model_dir / "config.json").is_file():
            continue
        from kit.modelinfo import inspect_model_dir  # only where there is a config to read

        info = inspect_model_dir(model_dir)
        heads = info.num_attention_heads
        if heads and heads % service.tp:
            problems.append(SpecProblem(
                ("services", i, "gpus"),
                f"tensor parallel size {service.tp} does not divide the model's "
                f"{heads} attention heads",
                "use a GPU count that divides the head count (e.g. 1, 2, 4, 8)",
            ))
        limit = info.derived_max_model_len
        if limit and service.max_model_len > limit:
            problems.append(SpecProblem(
                ("services", i, "max_model_len"),
                f"max_model_len {service.max_model_len} is above the model's limit {limit} "
                f"(vLLM refuses to start)",
                f"set max_model_len to at most {limit}",
            ))
        if info.requires_trust_remote_code and not service.trust_remote_code:
            problems.append(SpecProblem(
                ("services", i, "trust_remote_code"),
                "the model's config.json has auto_map (custom code); vLLM refuses it without "
                "trust_remote_code",
                "set trust_remote_code: true if you trust this model's code",
            ))
    return problems
