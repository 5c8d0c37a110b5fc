"""diagnose() on real vLLM start-up failures: tests/data/vllm-failures, each citing its source.

Each sample starts with a header (`source:`, `expect:` the spec key or `none`, optional
`mentions:` text the fix must contain), then `---`, then the log lines as vLLM printed them.
"""

from dataclasses import dataclass
from pathlib import Path

import pytest

from kit.converge.diagnose import RULES, diagnose
from tests.support.sites import REPO

SAMPLES = REPO / "tests" / "data" / "vllm-failures"


@dataclass(frozen=True)
class Sample:
    name: str
    expect: str | None
    mentions: str | None
    log: str


def load(path: Path) -> Sample:
    header, separator, log = path.read_text().partition("\n---\n")
    assert separator, f"{path.name}: no '---' line after the header"
    fields = dict(line.split(": ", 1) for line in header.splitlines())
    assert fields.get("source"), f"{path.name}: every sample names its source"
    expect = fields["expect"]
    return Sample(path.stem, None if expect == "none" else expect, fields.get("mentions"), log)


ALL = [load(path) for path in sorted(SAMPLES.glob("*.txt"))]
FAILURES = [s for s in ALL if s.expect]
UNRELATED = [s for s in ALL if not s.expect]


@pytest.mark.parametrize("sample", FAILURES, ids=lambda s: s.name)
def test_each_failure_names_the_spec_key(sample: Sample) -> None:
    found = diagnose(sample.log)
    assert found is not None, f"{sample.name} was not recognised"
    assert found.spec_key == sample.expect
    assert found.evidence in sample.log.splitlines() or found.evidence in sample.log
    assert found.cause and found.fix
    if sample.mentions:
        assert sample.mentions in found.fix + found.cause


@pytest.mark.parametrize("sample", UNRELATED, ids=lambda s: s.name)
def test_unrelated_logs_give_none(sample: Sample) -> None:
    assert diagnose(sample.log) is None


def test_every_rule_has_a_real_sample() -> None:
    matched = {id(rule) for s in FAILURES for rule in RULES if rule.pattern.search(s.log)}
    missing = [rule.pattern.pattern[:60] for rule in RULES if id(rule) not in matched]
    assert not missing, f"rules without a sample in {SAMPLES}: {missing}"


def sample(name: str) -> Sample:
    return next(s for s in ALL if s.name == name)


def test_the_value_error_beats_the_generic_trailer() -> None:
    found = diagnose(sample("kv-cache-too-small").log)
    assert found is not None
    assert "ValueError: To serve at least one request" in found.evidence
    assert "Engine core initialization failed" not in found.evidence


def test_kv_cache_fix_gives_the_length_that_fits() -> None:
    found = diagnose(sample("kv-cache-too-small").log)
    assert found is not None
    assert "at most 4656" in found.fix and "gpu_memory_utilization" in found.fix
    assert "131072" in found.cause


def test_model_limit_is_the_smallest_derived_value() -> None:
    found = diagnose(sample("max-model-len-over-limit").log)
    assert found is not None
    assert "at most 131072" in found.fix and "200000" in found.cause


def test_head_count_fix_lists_gpu_counts_that_divide() -> None:
    found = diagnose(sample("tp-heads-v0").log)
    assert found is not None
    assert "(1, 2, 4)" in found.fix  # 52 heads: 8 GPUs do not divide, 4 do


def test_unknown_quantization_suggests_close_methods() -> None:
    found = diagnose(sample("unknown-quantization").log)
    assert found is not None
    assert "'fp4'" in found.cause and "mxfp4" in found.fix


def test_invalid_choice_of_a_flag_kit_does_not_set_points_at_extra_args() -> None:
    log = "main.py serve: error: argument --load-format: invalid choice: 'x' (choose from 'auto')"
    found = diagnose(log)
    assert found is not None and found.spec_key == "services[].extra_args"


def test_oom_counts_only_a_weights_line_before_it() -> None:
    weights_line, oom_line = sample("cuda-oom-after-load").log.splitlines()[:2]
    before = diagnose(weights_line + "\n" + oom_line)
    after = diagnose(oom_line + "\n" + weights_line)
    assert before is not None and before.spec_key == "services[].gpu_memory_utilization"
    assert after is not None and after.spec_key == "services[].gpus"


def test_the_more_specific_rule_wins_whatever_the_order() -> None:
    kv, oom = sample("no-cache-memory").log, sample("cuda-oom-loading").log
    for log in (kv + oom, oom + kv):
        assert diagnose(log).spec_key == "services[].gpu_memory_utilization"  # type: ignore[union-attr]
    shm, bus = sample("shm-nccl-segment").log, sample("bus-error").log
    found = diagnose(bus + shm)
    assert found is not None and "shared memory segment" in found.evidence


def test_multi_node_fixes_name_the_interface_port_and_counts() -> None:
    interface = diagnose(sample("multinode-wrong-interface").log)
    assert interface is not None and "'bond1'" in interface.cause
    port = diagnose(sample("multinode-port-blocked").log)
    assert port is not None and "172.17.0.9:50437" in port.cause and "600000ms" in port.cause
    missing = diagnose(sample("multinode-node-missing").log)
    assert missing is not None and "only 1 of 2 nodes joined the head within 901 s" in (
        missing.cause)
    timeout = diagnose(sample("multinode-nccl-timeout").log)
    assert timeout is not None and "ALLREDUCE" in timeout.cause and "1800 s" in timeout.cause
