"""Per-credential policy as the operator sets and reads it (docs/policy.md): every bad value is
exit 2 naming the option and writes nothing; the policy file is 0600 beside the key digests;
what the door reads holds only credentials that exist; `list` shows each credential's policy."""

import datetime as dt
import json
import stat
from pathlib import Path

import pytest

from kit.credentials.policy import door_policy, parse_expiry, read_policies, shown_policy
from kit.engine.desired import load_desired
from kit.errors import BadInput
from kit.layout import SiteLayout
from tests.support.adapters import write_adapter
from tests.support.cli import run_kit
from tests.support.sites import tree

NOW = dt.datetime(2026, 12, 2, 5, 0, tzinfo=dt.UTC)


@pytest.fixture
def spec(site: Path) -> Path:
    spec = site / "site.yaml"
    assert run_kit("render", spec).exit_code == 0
    assert run_kit("keys", "add", spec, "bot", "--offline").exit_code == 0
    return spec


@pytest.mark.parametrize(("text", "instant"), [
    ("2027-01-31", "2027-01-31T00:00:00Z"),
    ("2027-01-31T18:00:00+01:00", "2027-01-31T17:00:00Z"),
    ("2027-01-31T18:00", "2027-01-31T18:00:00Z"),
])
def test_an_expiry_is_an_instant_in_utc(text: str, instant: str) -> None:
    assert parse_expiry(text, NOW) == instant


@pytest.mark.parametrize(("args", "says"), [
    (["--models", "Llama-3.1-8b"], "the site serves no model named 'Llama-3.1-8b'"),
    (["--models", "llama-3.1-8b,"], "lists an empty name"),
    (["--models", "x\"};"], "the site serves no model named"),
    (["--expires", "2020-01-01"], "is in the past"),
    (["--expires", "next tuesday"], "is not a date or time"),
    (["--tokens-per-day", "0"], "--tokens-per-day 0 is out of range"),
    (["--requests-per-minute", "-5"], "--requests-per-minute -5 is out of range"),
    # Python's int() and fromisoformat() take these; a reader would not (issue 42, item 13)
    (["--tokens-per-day", "\uff11\uff10"], "is not a whole number in ASCII digits"),
    (["--tokens-per-day", "1_000"], "is not a whole number in ASCII digits"),
    (["--tokens-per-month", " 10"], "is not a whole number in ASCII digits"),
    (["--expires", "2027-W01"], "is not a date or time"),
    (["--expires", "20270131"], "is not a date or time"),
    (["--expires", "2027-01-31T18"], "is not a date or time"),
])
@pytest.mark.parametrize("verb", ["add", "set"])
def test_bad_input_is_refused_and_writes_nothing(spec: Path, args: list[str], says: str,
                                                 verb: str) -> None:
    before = tree(spec.parent)
    result = run_kit("keys", verb, spec, "ci" if verb == "add" else "bot", "--offline", *args)
    assert result.exit_code == 2, result.output
    assert says in result.output and "fix:" in result.output
    assert tree(spec.parent) == before


@pytest.mark.parametrize(("args", "says"), [
    (["keys", "set", "{spec}", "bot", "--offline"], "nothing to change"),
    (["keys", "set", "{spec}", "bot", "--offline", "--class", "batch", "--clear", "class"],
     "class is both set and cleared"),
    (["keys", "set", "{spec}", "nobody", "--offline", "--class", "batch"],
     "there is no key named 'nobody'"),
    (["users", "set", "{spec}", "nobody", "--offline", "--class", "batch"],
     "there is no user named 'nobody'"),
    (["users", "set", "{spec}", "kit-probe", "--offline", "--class", "batch"],
     "kit's probe identity"),
    (["keys", "set", "{spec}", "bot", "--offline", "--class", "bulk"], "'bulk' is not one of"),
])
def test_what_cannot_be_set_is_refused(spec: Path, args: list[str], says: str) -> None:
    before = tree(spec.parent)
    result = run_kit(*[str(spec) if arg == "{spec}" else arg for arg in args])
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert tree(spec.parent) == before


def test_set_changes_what_it_is_given_and_list_shows_it(spec: Path) -> None:
    layout = SiteLayout(spec.parent)
    assert run_kit("keys", "set", spec, "bot", "--offline", "--models", "llama-3.1-8b",
                   "--class", "batch", "--tokens-per-day", "2000000").exit_code == 0
    assert run_kit("keys", "set", spec, "bot", "--offline", "--expires", "2099-01-31",
                   "--clear", "class").exit_code == 0
    assert read_policies(layout) == {"key:bot": {
        "models": ["llama-3.1-8b"], "tokens_per_day": 2000000,
        "expires": "2099-01-31T00:00:00Z"}}
    assert stat.S_IMODE(layout.policy_db.stat().st_mode) == 0o600
    assert stat.S_IMODE(layout.door_policy.stat().st_mode) == 0o600
    listed = run_kit("keys", "list", spec).output
    assert ("class interactive  models llama-3.1-8b  expires 2099-01-31T00:00:00Z  "
            "tokens-per-day 2000000") in listed
    assert run_kit("keys", "set", spec, "bot", "--offline", "--clear", "models", "--clear",
                   "expires", "--clear", "tokens-per-day").exit_code == 0
    assert read_policies(layout) == {}
    assert "class interactive  models all  expires never" in run_kit("keys", "list", spec).output


def test_a_lora_adapter_is_a_model_a_credential_may_be_given(site: Path) -> None:
    """Adapters are models clients ask for (docs/adapters.md): the list takes their names."""
    spec = site / "site.yaml"
    write_adapter(site.parent / "models" / "support", base="llama-8b")
    spec.write_text(spec.read_text().replace(
        "    max_num_seqs: 64\n", "    max_num_seqs: 64\n"
        "    adapters: [{name: support-v3, path: support}]\n", 1))
    assert run_kit("render", spec).exit_code == 0
    added = run_kit("keys", "add", spec, "helpdesk", "--offline", "--models", "support-v3")
    assert added.exit_code == 0, added.output
    assert "models support-v3" in run_kit("keys", "list", spec).output


def test_a_user_gets_a_policy_when_added(spec: Path) -> None:
    added = run_kit("users", "add", spec, "ann", "--password-stdin", "--offline", "--class",
                    "batch", stdin="a-long-enough-password-7\n")
    assert added.exit_code == 0, added.output
    assert "ann\tadded\tclass batch  models all" in run_kit("users", "list", spec).output
    assert run_kit("users", "remove", spec, "ann", "--offline").exit_code == 0
    assert read_policies(SiteLayout(spec.parent)) == {}


def test_the_door_reads_only_credentials_that_exist() -> None:
    policies = {"user:gone": {"class": "batch"},
                "key:bot": {"models": ["m"], "expires": "2027-01-31T00:00:00Z",
                            "tokens_per_day": 1000, "requests_per_minute": 6}}
    body = json.loads(door_policy(policies, {"key:bot", "user:ops"}))
    assert body == {"batch": False,  # the only batch credential is gone
                    "credentials": {"key:bot": {"models": {"m": True}, "expires": 1801353600000,
                                                "tokens_per_day": 1000,
                                                "requests_per_minute": 6}}}
    assert json.loads(door_policy(policies, {"user:gone"}))["batch"] is True


def test_a_budget_needs_the_usage_ledger(spec: Path) -> None:
    """Budgets count the ledger's tokens: with the ledger off, setting one is refused, and a
    render of a site whose stored policy has one is refused too (nothing written); requests
    per minute need no ledger."""
    budget = run_kit("keys", "set", spec, "bot", "--offline", "--tokens-per-month", "9")
    assert budget.exit_code == 0, budget.output
    spec.write_text(spec.read_text() + "usage: {enabled: false}\n")
    before = tree(spec.parent)
    for args in (["keys", "set", spec, "bot", "--offline", "--tokens-per-day", "5"],
                 ["render", spec]):
        refused = run_kit(*args)
        assert refused.exit_code == 2, refused.output
        assert "token budgets need the usage ledger" in refused.output
        assert "usage: {enabled: true}" in refused.output
        assert tree(spec.parent) == before
    assert run_kit("keys", "set", spec, "bot", "--offline", "--clear", "tokens-per-month",
                   "--requests-per-minute", "5").exit_code == 0
    assert run_kit("render", spec).exit_code == 0


def test_an_expired_credential_says_so_in_the_list() -> None:
    policies = {"key:bot": {"expires": "2026-12-01T00:00:00Z"}}
    assert "expires 2026-12-01T00:00:00Z (EXPIRED: refused)" in shown_policy(
        policies, "key:bot", NOW)


def test_a_corrupt_policy_file_is_named_with_its_way_out(spec: Path) -> None:
    layout = SiteLayout(spec.parent)
    layout.policy_db.write_text('{"key:bot": {"models": ["a\\"b"]}}')
    with pytest.raises(BadInput) as refused:
        read_policies(layout)
    assert str(layout.policy_db) in refused.value.message
    assert "backup" in refused.value.fix


def test_a_batch_credential_restarts_no_service(spec: Path) -> None:
    """Every service runs vLLM's priority scheduler from the start (issue 42): the first batch
    credential changes no byte of the compose file, so `kit up` recreates nothing (a
    single-replica service would be down meanwhile); the door caps batch at half the slots."""
    compose = spec.parent / "compose" / "docker-compose.yml"
    before = compose.read_bytes()
    assert b'"--scheduling-policy", "priority"' in before
    desired = load_desired(SiteLayout(spec.parent), "unit")
    made_batch = run_kit("keys", "set", spec, "bot", "--offline", "--class", "batch")
    assert made_batch.exit_code == 0, made_batch.output
    assert "restart" not in made_batch.output
    assert run_kit("render", spec).exit_code == 0
    assert compose.read_bytes() == before
    after = load_desired(SiteLayout(spec.parent), "unit")
    assert [s.config_hash for s in after.services] == [s.config_hash for s in desired.services]
    nginx_conf = (spec.parent / "nginx" / "nginx.conf").read_text()
    assert "limit_conn kit_batch_in_flight 32;" in nginx_conf
    assert run_kit("keys", "set", spec, "bot", "--offline", "--clear", "class").exit_code == 0
    assert run_kit("render", spec).exit_code == 0
    assert compose.read_bytes() == before


def test_the_operators_scheduling_policy_wins(site: Path) -> None:
    spec = site / "site.yaml"
    text = spec.read_text()
    spec.write_text(text.replace('extra_args: ["--enable-prefix-caching"]',
                                 'extra_args: ["--enable-prefix-caching", '
                                 '"--scheduling-policy=fcfs"]'))
    assert spec.read_text() != text
    assert run_kit("render", spec).exit_code == 0
    command = (site / "compose" / "docker-compose.yml").read_text()
    assert "--scheduling-policy=fcfs" in command and '"priority"' not in command
