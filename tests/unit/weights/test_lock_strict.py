"""site.lock read as strictly as the spec (issue 42, item 11): a lock that is not YAML, carries a
Python tag, nests 100,000 levels, repeats a key, writes a number in another base or keeps a git
merge conflict is exit 2 at `site.lock:LINE:COL` with the fix, from every verb that reads it;
never a traceback, never the last of two keys silently."""

from pathlib import Path

import pytest

from kit.errors import BadInput
from kit.weights.lock import read_lock
from tests.support.cli import run_kit
from tests.support.pinned_site import MODEL, pinned_on_disk, pinned_spec


def conflicted(text: str) -> str:
    """The lock as git leaves it after a merge whose two sides changed the commit."""
    ours = text.replace("    commit: " + "c" * 40, "<<<<<<< HEAD\n    commit: " + "c" * 40, 1)
    return ours.replace("c" * 40 + "\n", "c" * 40 + "\n=======\n    commit: " + "d" * 40 +
                        "\n>>>>>>> theirs\n", 1)


HOSTILE = {
    # name: (the lock's text from a good one, what the message says, the text it points at)
    "a git merge conflict": (conflicted, "a git merge conflict marker (<<<<<<<)", "<<<<<<<"),
    "not YAML": (lambda t: t + "models: {acme/tiny@main: [\n", "invalid YAML", None),
    "a python tag on a scalar": (lambda t: t.replace("revision: main",
                                                     "revision: !!python/name:os.system ''"),
                                 "could not determine a constructor", "!!python"),
    "a python object": (lambda t: t + "evil: !!python/object/apply:os.system [id]\n",
                        "the tag tag:yaml.org,2002:python/object/apply:os.system is not "
                        "allowed", "!!python"),
    "100,000 levels deep": (lambda t: t + "deep: " + "[" * 100_000 + "]" * 100_000 + "\n",
                            "nested deeper than 16 levels", "[" * 16 + "]"),
    "a duplicate key": (lambda t: t.replace("    revision: main\n",
                                            "    revision: main\n    revision: other\n"),
                        "models.acme/tiny@main.revision: duplicate key 'revision'",
                        "revision: other"),
    "an octal size": (lambda t: t.replace("size: ", "size: 0", 1),
                      "is an octal number in YAML 1.1", "size: 0"),
}


def line_of(text: str, anchor: str | None) -> str:
    """`LINE:` of the first line holding `anchor` (the end of the text for None)."""
    offset = len(text) if anchor is None else text.index(anchor)
    return f"{text[:offset].count(chr(10)) + 1}:"


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_lock_is_refused_at_its_position(tmp_path: Path, case: str) -> None:
    spec = pinned_spec(tmp_path)
    pinned_on_disk(tmp_path / "models", spec.parent)
    lock = spec.parent / "site.lock"
    change, says, anchor = HOSTILE[case]
    lock.write_text(change(lock.read_text()))
    with pytest.raises(BadInput) as caught:
        read_lock(lock)
    message = str(caught.value)
    assert f"{lock}:{line_of(lock.read_text(), anchor)}" in message and says in message, message
    assert "kit lock SPEC" in message


@pytest.mark.parametrize("verb", ["validate", "up", "pull", "bundle"])
def test_every_verb_names_the_conflict_in_the_lock(tmp_path: Path, verb: str) -> None:
    spec = pinned_spec(tmp_path)
    pinned_on_disk(tmp_path / "models", spec.parent)
    lock = spec.parent / "site.lock"
    lock.write_text(conflicted(lock.read_text()))
    args = {"bundle": ["--out", tmp_path / "b.tar"]}.get(verb, [])
    result = run_kit(verb, spec, *args)
    assert result.exit_code == 2, result.output
    line = line_of(lock.read_text(), "<<<<<<<")
    assert f"{lock}:{line}1: a git merge conflict marker" in result.output, result.output
    assert "resolve the git merge conflict" in result.output
    assert "Traceback" not in result.output
    assert (tmp_path / "models" / f"{MODEL}@main").is_dir()
