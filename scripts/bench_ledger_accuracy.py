#!/usr/bin/env python3
"""The usage ledger's accuracy against the engine's own counters (issue 43): the accuracy table.

The no-Docker door of `scripts/bench_frontdoor.py --ledger` (the rendered nginx.conf with the
ledger on, Debian 13's nginx + njs, the rendered verifier, the vLLM stand-in as a process in a
network namespace of their own) and a second one before a pooling stand-in (`--runner pooling`:
vLLM registers /v1/embeddings only for a pooling model). The OpenAI Python SDK sends, group by
group, each route the door meters (chat completions, completions, responses, embeddings) with
each kind of credential (a Basic user; a Bearer key; a Bearer key with a token budget it never
reaches, for which the door asks vLLM usage on every chunk), whole and streamed, completed and
left by the client after a random number of read chunks (1 to --abort-chunks).

The engine's side is the stand-in's `vllm:prompt_tokens_total` / `vllm:generation_tokens_total`,
read once nothing runs: around each group of completed requests (the group alone on the engine,
--concurrency at a time), around each abort (one at a time, so every abort has its own figures).
The ledger's side is what kit's collector (kit/dataplane/collector/usage_ledger.py, run here
in-process on the door's spool) wrote to its ledger; each request is found there through its
User-Agent (the access log's request id) and the spool's door seq, so a request without a record
is lost and one with two is duplicated.

Expected today (docs/usage.md, "What the door asks vLLM, and what an aborted stream is recorded
with"): a completed request's prompt and completion exactly the engine's; an abort's completion
within one chunk of what the engine generated (one token a chunk), its prompt null without a
budget and the engine's own with one — the engine's own for every credential with
--api-servers 2 or more (the service rendered with `api_servers: N`: the door asks every stream
usage on every chunk), /v1/responses aside (vLLM 0.33 gives it no stream_options); a
budgeted credential refused a streamed /v1/responses (400); nothing lost or duplicated. Exit
status 1 when a figure is not that.

    python3 scripts/bench_ledger_accuracy.py [--requests 14] [--aborts 5] [--concurrency 8]
                                             [--abort-chunks 40] [--seed 43]
                                             [--interval-ms 5 | --calibrated]
                                             [--api-servers 1]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import openai
from bench_frontdoor import LEDGER_SITE, bench_door, machine, standin_pacing

from kit.bench.run import prompt_text
from kit.dataplane.collector import usage_ledger
from kit.render.usage import ledger_routes
from tests.support.cli import run_kit
from tests.support.door_ns import Door, serving_door
from tests.support.usage_collector import chain_breaks, ledger_records

SERVICE, SERVED, DOMAIN = LEDGER_SITE
ROUTES = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
          "responses": "/v1/responses", "embeddings": "/v1/embeddings"}
CREDENTIALS = {"basic": "Basic user", "bearer": "Bearer key", "budget": "Bearer key, budget"}
BUDGET_TOKENS = 10**12  # a day: never reached, every request still counted against it
ABORT_MAX_TOKENS = 2000  # an aborted stream is left long before it would end
AGENT = re.compile(r'"(acc-[\w.-]+)" id=(\w+)')  # the access log: User-Agent, request id


@dataclass(frozen=True)
class Group:
    """Requests of one route and credential, whole or streamed, completed or aborted."""

    route: str  # a key of ROUTES
    credential: str  # a key of CREDENTIALS
    kind: str  # "whole", "stream" or "abort"

    @property
    def refused(self) -> bool:
        """The door refuses a budgeted credential a streamed response (docs/usage.md)."""
        return self.route == "responses" and self.credential == "budget" and self.kind != "whole"

    @property
    def label(self) -> str:
        return f"{self.route}-{self.credential}-{self.kind}"


def groups() -> list[Group]:
    """Every route x credential x kind the door meters; embeddings are never streamed."""
    found = [Group(route, credential, kind) for route in ("chat", "completions", "responses")
             for credential in CREDENTIALS for kind in ("whole", "stream", "abort")]
    found = [g for g in found if not (g.refused and g.kind == "abort")]
    return found + [Group("embeddings", credential, "whole") for credential in CREDENTIALS]


@dataclass
class Sent:
    """One request: its User-Agent (how it is found in the access log), the HTTP status it got
    (0: no answer), and for an abort the engine's counts around it alone."""

    agent: str
    status: int
    engine: tuple[int, int] | None = None


@dataclass
class Row:
    """One group's line of the table."""

    group: Group
    sent: list[Sent]
    engine_prompt: int
    engine_completion: int
    ledger_prompt: int = 0  # over the records with a prompt
    ledger_completion: int = 0
    prompt_null: int = 0
    completion_null: int = 0  # a refusal's
    ends: Counter = field(default_factory=Counter)
    abort_diffs: list[int] = field(default_factory=list)  # engine - ledger completion, in chunks
    abort_prompt_diffs: list[int] = field(default_factory=list)  # engine - ledger, with a prompt
    lost: int = 0
    duplicates: int = 0

    @property
    def statuses(self) -> Counter:
        return Counter(sent.status for sent in self.sent)

    def problems(self, every_chunk: bool = False) -> list[str]:
        """What differs from today's expected result (the module's docstring); `every_chunk`:
        the door asked every stream usage on every chunk (the service's API servers >= 2)."""
        group, found = self.group, []
        status, end = (400, "refused_request") if group.refused else (
            200, "client_abort" if group.kind == "abort" else "completed")
        if self.statuses != Counter({status: len(self.sent)}):
            found.append(f"statuses {dict(self.statuses)}, expected {status}")
        if self.ends != Counter({end: len(self.sent) - self.lost}):
            found.append(f"ended {dict(self.ends)}, expected {end}")
        if self.lost or self.duplicates:
            found.append(f"{self.lost} lost, {self.duplicates} duplicated")
        if group.refused:
            if (self.engine_prompt, self.engine_completion) != (0, 0):
                found.append("the engine counted tokens of refused requests")
            return found
        if group.kind != "abort":
            if self.prompt_null or self.completion_null:
                found.append(f"{self.prompt_null} records without a prompt, "
                             f"{self.completion_null} without a completion")
            if (self.ledger_prompt, self.ledger_completion) != (self.engine_prompt,
                                                                self.engine_completion):
                found.append("the ledger's tokens are not the engine's")
            return found
        if any(not 0 <= diff <= 1 for diff in self.abort_diffs):
            found.append(f"aborts off by {sorted(set(self.abort_diffs))} chunks (within 1)")
        # /v1/responses has no stream_options in vLLM 0.33: no usage before its last event
        if group.credential == "budget" or (every_chunk and group.route != "responses"):
            if self.prompt_null or any(self.abort_prompt_diffs):
                found.append("an abort asked every chunk's usage has not the engine's prompt")
        elif self.prompt_null != len(self.sent) - self.lost:
            found.append(f"{len(self.sent) - self.prompt_null} unbudgeted aborts with a prompt")
        return found


def clients(door: Door, keys: dict[str, str]) -> dict[str, openai.OpenAI]:
    """An SDK client per credential, over TLS to the door (the site CA trusted), no retries:
    one request each is what the ledger must hold."""
    return {name: openai.OpenAI(
        base_url="https://127.0.0.1/v1", api_key="set-by-the-header", max_retries=0,
        default_headers={"Authorization": authorization}, timeout=120,
        http_client=httpx2.Client(verify=door.tls_context())) for name, authorization in
        keys.items()}


def send(client: openai.OpenAI, group: Group, agent: str, words: int, max_tokens: int,
         abort_after: int) -> int:
    """One request of `group` with this User-Agent; a stream is read to its end, or left after
    `abort_after` events. The HTTP status (0: the request got no answer)."""
    prompt, stream, headers = prompt_text(words), group.kind != "whole", {"User-Agent": agent}
    reply: object
    try:
        if group.route == "chat":
            reply = client.chat.completions.create(
                model=SERVED, messages=[{"role": "user", "content": prompt}],
                max_tokens=max_tokens, stream=stream, extra_headers=headers)
        elif group.route == "completions":
            reply = client.completions.create(model=SERVED, prompt=prompt, max_tokens=max_tokens,
                                              stream=stream, extra_headers=headers)
        elif group.route == "responses":
            reply = client.responses.create(model=SERVED, input=prompt,
                                            max_output_tokens=max_tokens, stream=stream,
                                            extra_headers=headers)
        else:
            reply = client.embeddings.create(model=SERVED, input=prompt, extra_headers=headers)
    except openai.APIStatusError as error:
        return error.status_code
    except openai.APIError:
        return 0
    if isinstance(reply, openai.Stream):
        try:
            for number, _ in enumerate(reply, 1):
                if number == abort_after:
                    break
        except (httpx2.HTTPError, openai.APIError):
            return 0  # cut short: not what the client of its group does
        finally:
            reply.close()
    return 200


@dataclass
class Options:
    requests: int  # per group of completed (or refused) requests
    aborts: int  # per group of aborts
    concurrency: int
    abort_chunks: int  # an abort reads 1 to this many events
    seed: int
    interval_ms: int = 5  # the stand-in's token pace (not with calibrated)
    api_servers: int = 1  # the service's API-server processes (the spec's api_servers)


def run_group(door: Door, client: openai.OpenAI, group: Group, options: Options,
              rng: random.Random) -> Row:
    """The group's requests, alone on the engine, with the engine's counts around them."""
    count = options.aborts if group.kind == "abort" else options.requests
    planned = [(f"acc-{group.label}-{number}", rng.randint(5, 300),
                ABORT_MAX_TOKENS if group.kind == "abort" else rng.randint(1, 64),
                rng.randint(1, options.abort_chunks) if group.kind == "abort" else 0)
               for number in range(count)]

    def one(agent: str, words: int, max_tokens: int, abort_after: int) -> Sent:
        with door.inside():
            return Sent(agent, send(client, group, agent, words, max_tokens, abort_after))

    def alone(agent: str, words: int, max_tokens: int, abort_after: int) -> Sent:
        before = door.settled_counters()
        sent = one(agent, words, max_tokens, abort_after)
        after = door.settled_counters()
        sent.engine = (after[0] - before[0], after[1] - before[1])
        return sent

    start = door.settled_counters()
    if group.kind == "abort":
        sent = [alone(*request) for request in planned]
    else:
        with ThreadPoolExecutor(options.concurrency) as pool:
            sent = list(pool.map(lambda request: one(*request), planned))
    end = door.settled_counters()
    return Row(group, sent, end[0] - start[0], end[1] - start[1])


def written(door: Door, rows: list[Row], timeout: float = 10) -> tuple[dict, dict]:
    """nginx's buffers written out: each request's id by its User-Agent (the access log) and
    each request id's door position, (boot, seq) (the spool, read before the collector punches
    what it took out of it)."""
    agents = {sent.agent for row in rows for sent in row.sent}
    door.flush_logs()
    deadline = time.monotonic() + timeout
    while True:
        ids = dict(AGENT.findall(door.access_log.read_text()))
        if agents <= ids.keys() or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    time.sleep(0.5)  # the spool's buffer, written out on the same signal
    positions = {}
    for line in door.spool.read_text().splitlines():
        spooled = json.loads(line)
        positions[spooled["id"]] = (spooled["boot"], int(spooled["seq"]))
    return ids, positions


def collected(door: Door, folder: Path, timeout: float = 60) -> tuple[list[dict], dict]:
    """kit's collector on the door's spool until every line is in its ledger, aggregates
    included: the ledger's records and its health."""
    options = usage_ledger.parse_options([
        "--spool", str(door.spool), "--ledger", str(folder), "--retention-days", "400",
        "--max-bytes", str(1 << 30), "--port", "1", "--models", json.dumps([SERVED]),
        "--routes", json.dumps(ledger_routes()), "--grace", "0", "--aggregate-seconds", "1"])
    collector = usage_ledger.Collector(options)
    deadline = time.monotonic() + timeout
    while collector.step() or collector.aggregates:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the collector did not catch up in {timeout} s")
        time.sleep(0.1)
    collector.save()
    return ledger_records(folder), collector.health()


def reconcile(rows: list[Row], ids: dict[str, str], positions: dict[str, tuple[str, int]],
              records: list[dict]) -> None:
    """Each row's ledger figures: every request found by its User-Agent (access log) and its
    door seq (spool), then the records that stand for that seq (its own, or an aggregate's)."""
    standing: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for record in records:
        for first, last in record.get("door_seqs", [[record["door_seq"]] * 2]):
            for seq in range(first, last + 1):
                standing[(record["door_boot"], seq)].append(record)
    for row in rows:
        for sent in row.sent:
            found = standing.get(positions.get(ids.get(sent.agent, ""), ("", 0)), [])
            row.lost += not found
            row.duplicates += max(0, len(found) - 1)
            if not found:
                continue
            record = found[0]
            row.ends[record["ended"]] += 1
            prompt, completion = record["prompt_tokens"], record["completion_tokens"]
            row.prompt_null += prompt is None
            row.completion_null += completion is None
            row.ledger_prompt += prompt or 0
            completion = completion or 0
            row.ledger_completion += completion
            if sent.engine is not None:
                row.abort_diffs.append(sent.engine[1] - completion)
                if prompt is not None:
                    row.abort_prompt_diffs.append(sent.engine[0] - prompt)


def measure(options: Options, calibrated: bool = False,
            progress: Callable[[str], None] = print) -> tuple[list[Row], dict]:
    """Every group through the two doors; the rows in groups() order and what the collector's
    health said of each door's ledger (lost door seqs, duplicates it skipped, the chain)."""
    rng = random.Random(options.seed)
    args = argparse.Namespace(streams=options.concurrency, calibrated=calibrated,
                              interval_ms=options.interval_ms, api_servers=options.api_servers)
    rows: dict[Group, Row] = {}
    health: dict[str, dict] = {}
    with bench_door(args) as bench, tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        budget = run_kit("keys", "add", bench.spec, "budgeted", "--offline", "--tokens-per-day",
                         str(BUDGET_TOKENS)).output.split("key budgeted: ")[1].split()[0]
        keys = {**{name: bench.keys[name] for name in ("basic", "bearer")},
                "budget": f"Bearer {budget}"}
        bench.door.reload(bench.conf, bench.confs["on"])  # its workers read the new key
        pace = "calibrated on an H100" if calibrated else f"at {options.interval_ms} ms a token"
        progress(f"the ledger's accuracy: {options.requests} requests a group of completed "
                 f"ones ({options.concurrency} at a time), {options.aborts} aborts a group (one "
                 f"at a time, after 1-{options.abort_chunks} events); the stand-in {pace}; "
                 f"{bench.split.describe()}; {machine()} at the start")
        with pooling_door(bench.spec, work, args) as pooling:
            for name, door, route_groups in (
                    ("generative", bench.door, [g for g in groups() if g.route != "embeddings"]),
                    ("pooling", pooling, [g for g in groups() if g.route == "embeddings"])):
                sdk = clients(door, keys)
                for group in route_groups:
                    rows[group] = run_group(door, sdk[group.credential], group, options, rng)
                    progress(f"  {group.label}: {dict(rows[group].statuses)}")
                ids, positions = written(door, [rows[g] for g in route_groups])
                records, health[name] = collected(door, work / f"ledger-{name}")
                health[name]["chain_breaks"] = chain_breaks(records)
                reconcile([rows[g] for g in route_groups], ids, positions, records)
    return [rows[group] for group in groups()], health


@contextmanager
def pooling_door(spec: Path, work: Path, args: argparse.Namespace) -> Iterator[Door]:
    """The same rendered door (its nginx.conf with the ledger, its keys) before a pooling
    stand-in, which has /v1/embeddings."""
    folder = work / "pooling"
    folder.mkdir()
    pacing = standin_pacing(args)
    pacing["standin_args"] = (*pacing.get("standin_args", ()), "--runner", "pooling")
    with serving_door(spec.parent / "nginx", folder, [SERVICE],
                      spec.parent.parent / "models" / "llama-8b", SERVED, DOMAIN, verifier=True,
                      STANDIN_LOAD_SECONDS="0.1", **pacing) as door:
        yield door


def figures(ledger: int, engine: int, null: int, records: int) -> str:
    shown = "null" if records and null == records else f"{ledger:,}"
    return f"{shown} / {engine:,}"


def table(rows: list[Row]) -> str:
    """The accuracy table, in Markdown."""
    lines = ["| route | credential | requests | status | prompt ledger / engine | "
             "completion ledger / engine | prompt null | abort: engine - ledger (chunks) | "
             "lost | dup |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        group = row.group
        kind = {"whole": "whole", "stream": "streamed", "abort": "streamed, aborted"}[group.kind]
        records = len(row.sent) - row.lost
        diffs = (f"{min(row.abort_diffs):+d} .. {max(row.abort_diffs):+d}" if row.abort_diffs
                 else "")
        status = ", ".join(f"{count} x {code}" for code, count in sorted(row.statuses.items()))
        lines.append(
            f"| {ROUTES[group.route]} {kind} | {CREDENTIALS[group.credential]} | "
            f"{len(row.sent)} | {status} | "
            f"{figures(row.ledger_prompt, row.engine_prompt, row.prompt_null, records)} | "
            f"{figures(row.ledger_completion, row.engine_completion, row.completion_null, records)}"
            f" | "
            f"{row.prompt_null} | {diffs} | {row.lost} | {row.duplicates} |")
    return "\n".join(lines)


def verdict(rows: list[Row], health: dict[str, dict], every_chunk: bool = False) -> list[str]:
    """Every difference from today's expected result, by group and door; none: all as
    expected."""
    found = [f"{row.group.label}: {problem}" for row in rows
             for problem in row.problems(every_chunk)]
    for door, said in health.items():
        if said["lost"]["total"] or said["lost"]["unreadable_lines"] or said["chain_breaks"]:
            found.append(f"door {door}: the collector lost {said['lost']}, chain breaks at "
                         f"{said['chain_breaks']}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=14,
                        help="requests of each group that completes (or is refused)")
    parser.add_argument("--aborts", type=int, default=5, help="aborts of each group of aborts")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="completed requests of a group at a time")
    parser.add_argument("--abort-chunks", type=int, default=40,
                        help="an abort reads 1 to this many events before it leaves")
    parser.add_argument("--interval-ms", type=int, default=5, help="the stand-in's token pace")
    parser.add_argument("--calibrated", action="store_true",
                        help="the stand-in with the H100's costs (STANDIN_CALIBRATION=h100)")
    parser.add_argument("--seed", type=int, default=43, help="of the prompts, lengths, aborts")
    parser.add_argument("--api-servers", type=int, default=1, metavar="N",
                        help="the service's API-server processes (api_servers: N in its spec, "
                             "vLLM's --api-server-count N); 2 or more: every stream is asked "
                             "usage on every chunk")
    args = parser.parse_args()
    for name in ("requests", "aborts", "concurrency", "abort_chunks", "interval_ms",
                 "api_servers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be 1 or more")
    began = time.monotonic()
    rows, health = measure(Options(args.requests, args.aborts, args.concurrency,
                                   args.abort_chunks, args.seed, args.interval_ms,
                                   args.api_servers),
                           args.calibrated)
    every_chunk = args.api_servers > 1
    print("\n" + table(rows))
    total = sum(len(row.sent) for row in rows)
    aborts = sum(len(row.sent) for row in rows if row.group.kind == "abort")
    problems = verdict(rows, health, every_chunk)
    spread = Counter(diff for row in rows for diff in row.abort_diffs)
    print("\naborts, the engine's completion tokens minus the ledger's (chunks): "
          + ", ".join(f"{diff:+d} x {count}" for diff, count in sorted(spread.items())))
    print(f"{total} requests ({aborts} aborted); kit's collector: "
          + "; ".join(f"{door} door's ledger {said['records']} records, lost "
                      f"{said['lost']['total']}, duplicates skipped {said['duplicates_skipped']},"
                      f" chain {'whole' if not said['chain_breaks'] else 'BROKEN'}"
                      for door, said in health.items()))
    prompts = ("every abort's prompt exact but a response's (null)" if every_chunk
               else "unbudgeted aborts' prompt null, budgeted exact")
    print("\n".join(problems) if problems else "as expected: completed exact, aborts within one "
          f"chunk, {prompts}, nothing lost or duplicated")
    print(f"{time.monotonic() - began:.0f} s; {machine()} at the end")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
