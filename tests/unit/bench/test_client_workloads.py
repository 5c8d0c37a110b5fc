"""kit bench's workloads (kit/bench/client.py `Conversation`, docs/benchmarks.md): what the
prompts share — nothing (random), a system prompt (shared-prefix), or a user's conversation
re-sent with its answers turn after turn (multiturn), a share of users starting alike (hot)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kit.bench.client import Conversation, Endpoint
from tests.support.cli import run_kit
from tests.support.sites import base_site

BASE = Endpoint(address="127.0.0.1", port=443, host="h", tls=True, ca_file=None,
                authorization=None, model="m", prompt="tell me", output_tokens=8,
                system_words=40, turn_words=5, turns=3)


def test_random_prompts_share_nothing():
    conversation = Conversation(BASE)
    first, second = conversation.next_messages(1), conversation.next_messages(2)
    assert first == [{"role": "user", "content": "1 tell me"}]
    assert second[0]["content"] != first[0]["content"]


def test_shared_prefix_prompts_share_the_system_prompt_only():
    conversation = Conversation(replace(BASE, workload="shared-prefix"))
    first, second = conversation.next_messages(1), conversation.next_messages(2)
    assert first[0] == second[0] and first[0]["role"] == "system"
    assert len(first[0]["content"].split()) == 40
    assert first[1] != second[1] and len(first[1]["content"].split()) == 5


def test_a_multiturn_user_resends_the_conversation_then_a_new_user_begins():
    conversation = Conversation(replace(BASE, workload="multiturn"))
    sent = []
    for number in range(1, 5):
        sent.append([dict(m) for m in conversation.next_messages(number)])
        conversation.answered(f"answer {number}")
    assert [len(messages) for messages in sent] == [2, 4, 6, 2]  # 3 turns, then a new user
    assert sent[2][:4] == [*sent[1][:2], {"role": "assistant", "content": "answer 1"}, sent[1][3]]
    assert sent[3][0] == sent[0][0] and sent[3][1] != sent[0][1]  # same system, another user


def test_hot_users_start_alike():
    hot = [Conversation(replace(BASE, workload="multiturn", hot_share=1.0)).next_messages(n)
           for n in range(3)]
    cold = [Conversation(replace(BASE, workload="multiturn")).next_messages(n) for n in range(3)]
    assert hot[0] == hot[1] == hot[2]
    assert len({c[1]["content"] for c in cold}) == 3


def test_a_workload_with_mix_is_refused_before_anything_runs(tmp_path: Path):
    spec = base_site(tmp_path) / "site.yaml"
    result = run_kit("bench", spec, "--mix", "--workload", "multiturn")
    assert result.exit_code == 2 and "--workload" in result.output, result.output
