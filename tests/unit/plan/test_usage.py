"""`usage:` planned: on by default, its bounds in bytes and days, off when asked; a bad value or
an extra_args flag that works against the ledger is exit 2 naming the key, nothing written."""

from pathlib import Path

import pytest

from kit.plan.build import build_plan
from kit.plan.host import load_spec
from kit.plan.usage import usage_plan
from kit.render.usage import usage_facts
from tests.support.cli import run_kit
from tests.support.sites import base_site, tree


def with_usage(root: Path, usage: str, extra_args: str | None = None) -> Path:
    spec = base_site(root) / "site.yaml"
    text = spec.read_text().replace("services:\n", f"{usage}services:\n", 1)
    if extra_args is not None:
        text = text.replace('    extra_args: ["--enable-prefix-caching"]\n',
                            f"    extra_args: [{extra_args}]\n")
    spec.write_text(text)
    return spec


def test_on_by_default_with_its_bounds(tmp_path: Path) -> None:
    plan = usage_plan(load_spec(with_usage(tmp_path, ""), check_host=False))
    assert plan is not None and plan.retention_days == 400 and plan.max_bytes == 20 << 30
    assert plan.gpu_hour_cost is None


def test_the_operators_bounds_and_rate(tmp_path: Path) -> None:
    spec = with_usage(tmp_path, "usage: {retention_days: 90, max_disk: 512m, gpu_hour_cost: 2.5}\n")
    plan = usage_plan(load_spec(spec, check_host=False))
    assert plan is not None and (plan.retention_days, plan.max_bytes, plan.gpu_hour_cost) == (
        90, 512 << 20, 2.5)


def test_the_collectors_windows_reach_it_only_when_set(tmp_path: Path) -> None:
    """usage.aggregate_seconds and usage.lost_after_seconds are the collector's
    --aggregate-seconds and --grace; left out, the collector keeps its own (60 s, 30 s) and the
    rendered files stay as they were."""
    def collector(spec: Path) -> dict:
        return usage_facts(build_plan(load_spec(spec, check_host=False)))

    default = collector(with_usage(tmp_path / "default", ""))["command"]
    assert "--aggregate-seconds" not in default and "--grace" not in default
    spec = with_usage(tmp_path / "set", "usage: {aggregate_seconds: 10, lost_after_seconds: 8}\n")
    plan = usage_plan(load_spec(spec, check_host=False))
    assert plan is not None and (plan.aggregate_seconds, plan.lost_after_seconds) == (10, 8)
    for command in ("command", "pod_command"):
        argv = collector(spec)[command]
        assert argv[argv.index("--aggregate-seconds") + 1] == "10"
        assert argv[argv.index("--grace") + 1] == "8"


def test_off_plans_nothing_and_allows_forced_usage(tmp_path: Path) -> None:
    spec = with_usage(tmp_path, "usage: {enabled: false}\n", '"--enable-force-include-usage"')
    assert usage_plan(load_spec(spec, check_host=False)) is None


@pytest.mark.parametrize(("usage", "extra_args", "message"), [
    ("", '"--enable-force-include-usage"',
     "--enable-force-include-usage conflicts with usage.enabled"),
    ("", '"--stream-interval", "8"', "--stream-interval conflicts with usage.enabled"),
    ("usage: {max_disk: 1m}\n", None, "too small for the usage ledger: give it at least 64m"),
    ("usage: {max_disk: 2t}\n", None, "usage.max_disk"),
    ("usage: {retention_days: 0}\n", None, "usage.retention_days"),
    ("usage: {gpu_hour_cost: -1}\n", None, "usage.gpu_hour_cost"),
    ("usage: {aggregate_seconds: 5}\n", None, "usage.aggregate_seconds"),
    ("usage: {aggregate_seconds: 3601}\n", None, "usage.aggregate_seconds"),
    ("usage: {lost_after_seconds: 4}\n", None, "usage.lost_after_seconds"),
    ("usage: {enable: false}\n", None, "did you mean 'enabled'?"),
])
def test_bad_usage_input_is_refused(tmp_path: Path, usage: str, extra_args: str | None,
                                    message: str) -> None:
    spec = with_usage(tmp_path, usage, extra_args)
    before = tree(spec.parent)
    result = run_kit("render", spec)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert tree(spec.parent) == before
