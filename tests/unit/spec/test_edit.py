"""kit's own edit of site.yaml (kit adapters add|remove): one adapter entry added or removed,
every other byte kept (comments, quoting, flow or block style, CRLF, a BOM), or refused when
the file's layout cannot be reproduced."""

import pytest

from kit.errors import BadInput
from kit.spec.edit import edit_adapters

BLOCK = """\
# the GPU server in rack 4
site: gpu01
services:
  - name: llama   # the base
    model: llama-3.1-8b-instruct
    gpus: [0, 1]
    adapters:
      - name: support   # helpdesk
        path: adapters/support
  - name: other
    model: "qwen"
    gpus: [2]
"""
LEGAL = {"name": "legal", "path": "adapters/legal"}


def test_an_entry_is_added_in_the_lists_style_and_nothing_else_changes() -> None:
    added = edit_adapters(BLOCK, "llama", add=LEGAL)
    assert added == BLOCK.replace("        path: adapters/support\n",
                                  "        path: adapters/support\n      - name: legal\n"
                                  "        path: adapters/legal\n")
    flow = BLOCK.replace("    adapters:\n      - name: support   # helpdesk\n"
                         "        path: adapters/support\n",
                         '    adapters: [{"name": "support", "path": "adapters/support"}]\n')
    assert edit_adapters(flow, "llama", add=LEGAL) == flow.replace(
        '"adapters/support"}]', '"adapters/support"}, {name: legal, path: adapters/legal}]')


def test_a_service_without_adapters_gets_the_key_after_its_name() -> None:
    added = edit_adapters(BLOCK, "other", add=LEGAL)
    assert added == BLOCK.replace("  - name: other\n", "  - name: other\n"
                                  "    adapters: [{name: legal, path: adapters/legal}]\n")


def test_remove_takes_the_entry_out_and_keeps_crlf_and_a_bom() -> None:
    text = "\ufeff" + BLOCK.replace("\n", "\r\n")
    both = edit_adapters(text, "llama", add=LEGAL)
    assert both.startswith("\ufeff") and both.count("\r\n") == both.count("\n")
    assert edit_adapters(both, "llama", remove="legal") == text
    emptied = edit_adapters(BLOCK, "llama", remove="support")
    assert "    adapters: []\n  - name: other" in emptied and "# the base" in emptied


@pytest.mark.parametrize(("text", "service", "remove", "found"), [
    (BLOCK, "none", None, "no service 'none'"),
    (BLOCK, "llama", "legal", "declares no adapter 'legal'"),
    (BLOCK.replace("gpus: [0, 1]", "gpus: [0,1]"), "llama", None,
     "laid out in a way kit cannot reproduce"),
    (BLOCK.replace("\n", "\r\n", 3), "llama", None, "mixes CRLF and LF"),
])
def test_what_cannot_be_edited_in_place_is_refused(text: str, service: str,
                                                   remove: str | None, found: str) -> None:
    with pytest.raises(BadInput, match=found):
        edit_adapters(text, service, add=None if remove else LEGAL, remove=remove)
