"""What a spec names on this machine: its TLS files, its model folders (and whether each model
fits its GPUs), the folders bound into containers, and the warnings worth a word before start-up.

The spec wing checks the spec alone (kit/spec/); these checks read files, so they run where the
spec is loaded for a verb (`load_spec`, `Site.load`), and their problems are reported with the
spec's own, sorted by position, in one error.
"""

import os
from functools import cached_property
from pathlib import Path

from kit import names
from kit.engine.desired import ServiceState
from kit.engine.url import DEFAULT_HOST, is_local, resolve
from kit.errors import BadInput
from kit.layout import SiteLayout
from kit.plan.adapters import (
    adapter_problems,
    lora_slots,
    model_name_or_path,
    service_adapters,
    source_folder,
)
from kit.plan.build import VLLM_ENTRYPOINT
from kit.spec.checks import Parts
from kit.spec.load import HostChecks, read_spec
from kit.spec.model import BIND_FIX, Service, Spec, gpu_memory_for
from kit.spec.problems import SpecProblem
from kit.spec.vllm_flags import GENERATE, SHIPPED_VERSION, image_version, last_values
from kit.weights import lock as weights_lock
from kit.weights.verify import HashCache, check_folder, tree_links_out


def load_spec(path: Path, *, check_host: bool = True, check_capacity: bool = True) -> Spec:
    """The spec at `path` with its host checks; SpecError lists every problem found.

    `check_host` False skips the model-directory and bind checks (verbs that only talk to the
    engine); `check_capacity` False leaves a service that cannot fit its GPUs to the caller
    (`kit plan` shows the whole capacity table first)."""
    return read_spec(path, host=host_checks(check_host=check_host, check_capacity=check_capacity))


def host_checks(*, check_host: bool = True, check_capacity: bool = True) -> HostChecks:
    """The checks of what the spec names here: TLS files always (they are read from the spec's
    folder), model folders and bind sources when the engine is this host's."""

    def run(parts: Parts, spec_dir: Path) -> list[SpecProblem]:
        problems = _tls_files(parts, spec_dir) + _ca_bundle(parts, spec_dir)
        if check_host and is_local(resolve(parts.engine)):  # elsewhere: the engine's preflight
            problems += _bind_sources(parts, resolve(parts.engine))
            if parts.models_root is not None:
                problems += _model_dirs(parts, spec_dir, check_capacity)
                problems += _sleep_memory(parts)
        return problems

    return run


MEMINFO = Path("/proc/meminfo")  # this host's memory (the engine's, when it is local)
# Of the host's memory, what level-1 sleep may fill with offloaded weights: vLLM pins them in
# CPU memory, beside the engines' own processes, the page cache and everything else.
SLEEP_HOST_SHARE = 0.8


def host_memory_bytes(meminfo: Path = MEMINFO) -> int | None:
    """MemTotal of /proc/meminfo; None when it cannot be read (not Linux)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _sleep_memory(parts: Parts) -> list[SpecProblem]:
    """Level-1 sleep moves each replica's weights to CPU memory (docs/sleep.md): all services
    with it may sleep at once (a quiet night), so their weights must fit in this host's memory."""
    from kit.plan.modelinfo import inspect_model_dir  # only where there is a config to read

    assert parts.models_root is not None
    sleepers = []
    for i, service in parts.services:
        model_dir = weights_lock.model_dir(parts.models_root, service)
        if (service.idle_sleep is None or service.idle_sleep.level != 1
                or not (model_dir / "config.json").is_file()):
            continue
        try:
            weights = inspect_model_dir(model_dir).weights_bytes
        except BadInput:
            continue  # _model_problems names it
        if weights:
            sleepers.append((i, service, weights * service.replica_count))
    host = host_memory_bytes(MEMINFO) if sleepers else None
    needed = sum(weights for _, _, weights in sleepers)
    if host is None or needed <= host * SLEEP_HOST_SHARE:
        return []
    gib = 1 << 30
    listed = ", ".join(f"{service.name} {weights / gib:.1f} GiB" for _, service, weights
                       in sleepers)
    return [SpecProblem(
        ("services", sleepers[-1][0], "idle_sleep", "level"),
        f"level-1 sleep keeps the weights of every sleeping replica in CPU memory: {listed} "
        f"({needed / gib:.1f} GiB when all sleep) is more than {SLEEP_HOST_SHARE:.0%} of this "
        f"host's {host / gib:.1f} GiB",
        "set `level: 2` for some of them (vLLM drops the weights and reloads them from disk at "
        "each wake), or run them on a host with more memory")]


def _bind_sources(parts: Parts, engine: str) -> list[SpecProblem]:
    """The folders vLLM's containers bind, as this host resolves them (symlinks followed): no
    system folder, nor one holding the engine's socket (its default one, and `engine:`'s)."""
    sockets = tuple(dict.fromkeys(os.path.realpath(socket.removeprefix("unix://")) for socket in (
        DEFAULT_HOST, engine) if socket.startswith("unix:///")))
    problems = []
    for key, path in (("models_root", parts.models_root), ("hf_cache", parts.hf_cache)):
        if path is None:
            continue
        real = os.path.realpath(path)
        refusal = names.bind_refusal(real, sockets)
        if refusal:
            shown = str(path) if real == names.normal_path(str(path)) else \
                f"{path} (a symlink to {real})"
            problems.append(SpecProblem((key,), f"{shown} {refusal}", BIND_FIX))
    return problems


def spec_warnings(spec: Spec, spec_path: Path) -> list[str]:
    """Things that are allowed but worth saying before start-up."""
    warnings = _exposed_secrets(spec, spec_path)
    version = image_version(spec.images.vllm)
    if version != SHIPPED_VERSION:
        warnings.append(
            f"images.vllm {spec.images.vllm!r} is not vLLM {SHIPPED_VERSION}: extra_args were "
            f"checked against the {SHIPPED_VERSION} flag list, the newest kit knows"
        )
    if not spec.auth.users and not spec.auth.api_keys:
        warnings.append("auth has no users and api_keys is off: only kit's probe can get in")
    for i, service in enumerate(spec.services):
        downloaded = service.revision is None and is_hub_id(spec.models_root, service.model)
        if downloaded and spec.offline:
            if spec.hf_cache is None:
                warnings.append(
                    f"OFFLINE: services[{i}] ({service.name}) model {service.model!r} is a Hub "
                    f"id, which vLLM serves offline from its own volume hf-cache-{service.name} "
                    "only: kit cannot "
                    "look into a volume, so make sure the model is there (or set hf_cache to a "
                    "host folder kit can check)"
                )
        elif downloaded:
            warnings.append(
                f"DOWNLOAD: services[{i}] ({service.name}) model {service.model!r} is no "
                f"directory under {spec.models_root}, so vLLM downloads it from the Hugging Face "
                "Hub and the backend network gets internet access for every service; if it is "
                "a typo of a local model, fix services[].model"
            )
        warnings += [
            f"DOWNLOAD: services[{i}].adapters[{j}] ({adapter.name}) {adapter.path!r} is no "
            f"directory under {spec.models_root}: vLLM downloads it from the Hugging Face Hub "
            "(unchecked, unpinned) and the backend network gets internet access"
            for j, adapter in enumerate(service.adapters)
            if source_folder(adapter, spec.models_root, spec.hf_cache) is None]
    return warnings


def is_hub_id(models_root: Path, model: str) -> bool:
    """`org/name` is a Hub id unless that directory exists under models_root on this host."""
    return "/" in model and not (models_root / model).is_dir()


def _tls_files(parts: Parts, spec_dir: Path) -> list[SpecProblem]:
    """Files mode: both files readable, and a pair that serves the domain (render's check)."""
    tls = parts.tls
    if tls is None or tls.mode != "files":
        return []
    problems = []
    content = {}
    for key in ("cert", "key"):
        value = getattr(tls, key)
        path = value if value.is_absolute() else spec_dir / value
        try:
            content[key] = path.read_bytes()
        except FileNotFoundError:
            problems.append(SpecProblem(
                ("tls", key), f"file {path} does not exist",
                f"point tls.{key} at your PEM {key} file (paths are relative to the spec)",
            ))
        except OSError as error:
            problems.append(SpecProblem(
                ("tls", key), f"cannot read {path}: {error.strerror or error}",
                "make it readable by the user running kit (or run kit as that user)",
            ))
    if problems or parts.domain is None:
        return problems
    from kit.credentials.tls import cert_problems  # TLS parsing only where there are files

    return [
        SpecProblem(("tls", "cert"), f"tls.cert/tls.key cannot be used: {problem}",
                    f"point tls.cert and tls.key at a current certificate for {parts.domain} "
                    "and its key")
        for problem in cert_problems(content["cert"], content["key"], parts.domain,
                                     str(tls.cert))
    ]


def _ca_bundle(parts: Parts, spec_dir: Path) -> list[SpecProblem]:
    """tls.ca_bundle: readable, CA certificates in PEM and nothing else (never a key)."""
    if parts.tls is None or parts.tls.ca_bundle is None:
        return []
    path = parts.tls.ca_bundle if parts.tls.ca_bundle.is_absolute() else (
        spec_dir / parts.tls.ca_bundle)
    fix = ("point tls.ca_bundle at the PEM certificate(s) of the CA that signs your ACME "
           "server and its certificates (step-ca: its root_ca.crt; paths are relative to the "
           "spec)")
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        return [SpecProblem(("tls", "ca_bundle"), f"file {path} does not exist", fix)]
    except OSError as error:
        return [SpecProblem(("tls", "ca_bundle"), f"cannot read {path}: "
                            f"{error.strerror or error}",
                            "make it readable by the user running kit (or run kit as that user)")]
    from kit.credentials.tls import ca_bundle_problems  # TLS parsing only where there is a file

    return [SpecProblem(("tls", "ca_bundle"), f"{path}: {problem}", fix)
            for problem in ca_bundle_problems(content)]


def _model_dirs(parts: Parts, spec_dir: Path, check_capacity: bool) -> list[SpecProblem]:
    """Checks that need the model directory on this host (skipped when it is elsewhere)."""
    models_root = parts.models_root
    if models_root is None or not models_root.is_dir():
        return []  # rendering away from the GPU server: nothing to check here
    problems = []
    pinned = PinnedCheck(SiteLayout(spec_dir))
    for i, service in parts.services:
        model_dir = weights_lock.model_dir(models_root, service)
        problems += _adapter_problems(parts, i, service, models_root)
        if service.revision is not None:
            found = pinned.problems(i, service, models_root)
            if found:
                problems += found
                continue
        elif is_hub_id(models_root, service.model):
            # vLLM downloads it (spec_warnings says so), or offline reads it from hf_cache
            problems += _offline_hub_model(parts, i, service)
            continue
        if not model_dir.is_dir():
            problems.append(SpecProblem(
                ("services", i, "model"),
                f"model directory {model_dir} does not exist",
                f"put the model under {models_root} or set model to an org/name Hub id",
            ))
            continue
        if outside := tree_links_out(models_root, model_dir):
            problems.append(SpecProblem(
                ("services", i, "model"), outside,
                f"move or copy the model into {models_root} (a link there may point only "
                "inside it: vLLM's container sees models_root alone)"))
            continue
        if (model_dir / "config.json").is_file():
            problems += _model_problems(parts, i, service, model_dir, check_capacity)
    return problems


def _offline_hub_model(parts: Parts, i: int, service: Service) -> list[SpecProblem]:
    """An offline site serves a Hub id only from the Hugging Face cache (HF_HOME/hub, the
    layout huggingface_hub writes): where that is a folder here, the model must be in it."""
    if not parts.offline or parts.hf_cache is None or not parts.hf_cache.is_dir():
        return []
    cached = parts.hf_cache / "hub" / ("models--" + service.model.replace("/", "--"))
    if any((cached / "snapshots").glob("*/config.json")):
        return []
    return [SpecProblem(
        ("services", i, "model"),
        f"offline: true, and {service.model!r} is neither a folder under {parts.models_root} "
        f"nor in hf_cache ({cached} has no snapshot with a config.json): vLLM cannot download "
        "it here",
        "copy the model into a folder under models_root, or its Hugging Face cache into "
        "hf_cache on a connected machine first (huggingface-cli download; docs/offline.md)",
    )]


class PinnedCheck:
    """A pinned service's folder against the lock file (kit/weights/verify.py): the lock read
    once, the hash cache in the spec's state folder shared by every service."""

    def __init__(self, layout: SiteLayout):
        self.layout = layout
        self.cache = HashCache(layout.weights_hashes)

    @cached_property
    def lock(self) -> dict[str, weights_lock.LockedModel] | None | BadInput:
        try:
            return weights_lock.read_lock(self.layout.lock_file)
        except BadInput as error:
            return error

    def problems(self, i: int, service: Service, models_root: Path) -> list[SpecProblem]:
        try:
            if isinstance(self.lock, BadInput):
                raise self.lock
            locked = weights_lock.locked_for(self.lock, self.layout.lock_file, service)
        except BadInput as error:
            return [SpecProblem(("services", i, "revision"), error.message, error.fix)]
        fix = (f"run `kit pull {service.name}`: it fetches missing and changed files again and "
               "removes extra ones")
        return [SpecProblem(("services", i, "model"), problem.message, fix)
                for problem in check_folder(weights_lock.model_dir(models_root, service), locked,
                                            self.cache, models_root)]


def _model_problems(
    parts: Parts, i: int, service: Service, model_dir: Path, check_capacity: bool
) -> list[SpecProblem]:
    """What vLLM would refuse about this model directory, at the key that can fix it."""
    from kit.plan.fit import service_capacity
    from kit.plan.modelinfo import (  # only where there is a config to read
        inspect_model_dir,
        pooling_architecture,
    )

    try:
        info = inspect_model_dir(model_dir)
    except BadInput as error:
        return [SpecProblem(("services", i, "model"), error.message, error.fix)]
    problems = [
        SpecProblem(("services", i, "model"), error,
                    "complete the model directory (re-download the missing or pointer files)")
        for error in info.errors
    ]
    pooling = pooling_architecture(info.architectures)
    if pooling and service.task == GENERATE and "--runner" not in last_values(service.extra_args):
        problems.append(SpecProblem(
            ("services", i, "extra_args"),
            f"{service.model} is a pooling model by its architecture ({pooling}): vLLM serves "
            "it without the completion routes kit proves a generative model with",
            'add "--runner", "pooling" to extra_args for an embedding model (kit then proves it '
            'with an embedding), or "--runner", "generate" if it does generate text',
        ))
    if info.requires_trust_remote_code and not service.trust_remote_code:
        problems.append(SpecProblem(
            ("services", i, "trust_remote_code"),
            "the model's config.json has auto_map (custom code); vLLM refuses it without "
            "trust_remote_code",
            "set trust_remote_code: true if you trust this model's code",
        ))
    memory = [gpu_memory_for(parts.gpu_memory_gib, gpu) for gpu in service.gpus]
    sizes = [gib for gib in memory if gib is not None]
    assert parts.models_root is not None  # _model_dirs reads model folders only under one
    adapters = service_adapters(service, parts.models_root, parts.hf_cache)
    if check_capacity and len(sizes) == len(memory):  # the plan covers heads and max_model_len too
        try:
            errors = service_capacity(info, service, min(sizes),
                                      lora=lora_slots(service, adapters)).errors
        except BadInput as error:
            errors = [error.message]
        return problems + [
            SpecProblem(("services", i), f"cannot start on this hardware: {error}",
                        "see `kit plan` for the capacity table")
            for error in errors if error not in info.errors
        ]
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
    return problems


def _adapter_problems(parts: Parts, i: int, service: Service,
                      models_root: Path) -> list[SpecProblem]:
    """Each adapter's files, base model and rank (kit/plan/adapters.py), at its entry."""
    infos = service_adapters(service, models_root, parts.hf_cache)
    saved_as = model_name_or_path(models_root / service.model)
    return [SpecProblem(("services", i, "adapters", j), problem, fix)
            for j, problem, fix in adapter_problems(service, infos, saved_as)]


def _exposed_secrets(spec: Spec, spec_path: Path) -> list[str]:
    """A spec holding tokens should not be readable by everyone (its env values are secrets)."""
    secret_names = [
        f"services[{service.name}].env.{name}" for service in spec.services for name in service.env
        if name.endswith(("_TOKEN", "_KEY", "_SECRET")) or "PASSWORD" in name
    ]
    if secret_names and spec_path.stat().st_mode & 0o004:
        return [f"{spec_path} holds {', '.join(secret_names)} and anyone on this host can read it: "
                f"chmod 600 {spec_path} (kit keeps these values in compose/<service>.env, 0600)"]
    return []


def model_below(service: ServiceState, target: str) -> str | None:
    """The folder under `target` that the service's model argument names, if any: the first
    argument of `vllm serve` as kit renders it, or `--model` in a compose file an older kit
    rendered (the image's own entrypoint then)."""
    argv = service.config.command
    if service.config.entrypoint == VLLM_ENTRYPOINT:
        model = argv[0] if argv else ""
    else:
        model = service.argument("--model") or ""
    return model.removeprefix(f"{target}/") if model.startswith(f"{target}/") else None
