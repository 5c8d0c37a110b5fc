"""The stand-in's model rules (tests/standin/vllm_standin/model.py) agree with kit's where both
imitate the same vLLM code: the stand-in's image carries no kit, so it keeps its own copy, and
this test keeps the copy equal (MAX_LEN_KEYS drifted from kit's three times, issue 44)."""

import sys

from kit.plan import modelinfo
from tests.support.standin_process import STANDIN

sys.path.insert(0, str(STANDIN))
from vllm_standin import model  # noqa: E402


def test_the_context_length_keys_are_kits() -> None:
    """vLLM's _get_and_verify_max_len reads these keys (smallest wins) in this order: a key kit
    reads and the stand-in does not gives a plan the stand-in's server contradicts."""
    assert model.MAX_LEN_KEYS == modelinfo.MAX_LEN_KEYS


def test_a_key_only_kit_knew_sets_the_stand_ins_limit_too() -> None:
    """Whisper's max_target_positions, the key the stand-in lacked: the stand-in's limit is
    the key's value, as vLLM's (and kit's) is."""
    config = {"max_position_embeddings": 4096, "max_target_positions": 448}
    source = model.ModelSource("whisper", None, config, {}, 0)
    assert model.derived_max_len(source) == ("max_target_positions", 448)
