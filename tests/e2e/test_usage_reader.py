"""kit usage and kit audit against a real Docker engine: the ledger's volume filled through the
archive API in a collector container that never started (docker cp reads a stopped one), read
back segment by segment (a recent period) and as the whole folder (a long one), then tampered
with and named by kit audit verify."""

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kit.engine.docker_api import connect
from kit.usage.ledger import LEDGER_DIR
from tests.support.cli import run_kit
from tests.support.sites import write_site
from tests.support.synthetic_ledger import (
    chained,
    ledger_files,
    record,
    stopped_collector,
    tar_of,
)

pytestmark = pytest.mark.e2e


def test_usage_and_audit_through_the_engine(tmp_path: Path, docker_client, test_images,
                                            compose_project) -> None:
    today = datetime.now(UTC).date()
    days = [(today - timedelta(days=n)).isoformat() for n in (40, 1, 0)]
    files = ledger_files(chained({day: [
        record(f"{day}T00:00:0{n}.000Z", who=f"key:{'ab'[n % 2]}", prompt=10 * n, completion=n)
        for n in range(1, 6)] for day in days}))
    collector = stopped_collector(docker_client, compose_project, test_images["vllm"], files)
    spec = write_site(tmp_path)
    spec.write_text(spec.read_text().replace("site: unit01", f"site: {compose_project}"))

    assert connect().archive(collector.id, f"{LEDGER_DIR}/segments/1999-01-01.jsonl") is None
    recent = run_kit("usage", spec, "--since", days[1], "--json")
    assert recent.exit_code == 0, recent.output
    assert [(r["who"], r["requests"], r["tokens"]) for r in json.loads(recent.output)["rows"]] \
        == [("key:a", 4, 2 * (22 + 44)), ("key:b", 6, 2 * (11 + 33 + 55))]
    whole = run_kit("usage", spec, "--since", "60d", "--by", "day", "--csv")
    assert whole.exit_code == 0 and whole.output.count("\n") == 4, whole.output

    verified = run_kit("audit", "verify", spec)
    assert verified.exit_code == 0, verified.output
    assert verified.output.startswith("ledger whole: 15 records in 3 segment(s)")
    segment = f"{LEDGER_DIR}/segments/{days[1]}.jsonl"
    lines = files[segment].splitlines(keepends=True)
    collector.put_archive("/", tar_of({segment: b"".join([lines[1], lines[0], *lines[2:]])}))
    tampered = run_kit("audit", "verify", spec)
    assert tampered.exit_code == 1
    assert f"segments/{days[1]}.jsonl line 1 (seq 7, request id req000007): out of order" \
        in tampered.output
