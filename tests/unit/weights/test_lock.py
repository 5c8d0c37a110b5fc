"""The lock file: written in a stable, reviewable order; read strictly (a broken or hostile
lock file is exit 2 naming the file, never a path outside the model's folder)."""

from pathlib import Path

import pytest

from kit.errors import BadInput
from kit.weights.lock import LockedFile, LockedModel, lock_text, read_lock, write_lock

COMMIT = "a" * 40
SHA = "b" * 64


def model(*paths: str, revision: str = "main") -> LockedModel:
    return LockedModel("acme/tiny", revision, COMMIT, tuple(LockedFile(p, 3, SHA) for p in paths))


def test_round_trip_in_a_stable_order(tmp_path: Path) -> None:
    lock = tmp_path / "site.lock"
    first = model("z.safetensors", "config.json", ".gitattributes")
    other = LockedModel("acme/b", COMMIT, COMMIT, (LockedFile("config.json", 1, SHA),))
    write_lock(lock, [first, other])
    text = lock.read_text()
    assert text == lock_text([other, model("config.json", ".gitattributes", "z.safetensors")])
    assert text.index("acme/b@") < text.index("acme/tiny@main")
    tiny = text[text.index("acme/tiny@main"):]
    assert tiny.index(".gitattributes") < tiny.index("config.json") < tiny.index("z.safet")
    read = read_lock(lock)
    assert read is not None and set(read) == {"acme/b@" + COMMIT, "acme/tiny@main"}
    assert read["acme/tiny@main"].files == tuple(sorted(first.files, key=lambda f: f.path))


def test_no_lock_file_is_nothing_yet(tmp_path: Path) -> None:
    assert read_lock(tmp_path / "site.lock") is None


@pytest.mark.parametrize(("change", "named"), [
    (("path: config.json", "path: ../../etc/passwd"), "not a plain relative path"),
    (("path: config.json", "path: /etc/passwd"), "not a plain relative path"),
    (("path: config.json", "path: .kit-partial/x"), "not a plain relative path"),
    (("path: config.json", "path: ."), "not a plain relative path"),  # the model's own folder
    (("sha256: " + SHA, "sha256: 1234"), "64-hex sha256"),
    (("size: 3", "size: -1"), "needs a size"),
    (("commit: " + COMMIT, "commit: main"), "40-hex commit"),
    (("acme/tiny@main:", "acme/other@main:"), "wrong key"),
    (("version: 1", "version: 9"), "version 1"),
])
def test_a_broken_lock_file_is_refused_naming_it(tmp_path: Path, change: tuple[str, str],
                                                 named: str) -> None:
    lock = tmp_path / "site.lock"
    write_lock(lock, [model("config.json")])
    lock.write_text(lock.read_text().replace(*change))
    with pytest.raises(BadInput) as caught:
        read_lock(lock)
    assert str(lock) in caught.value.message and named in caught.value.message
    assert "kit lock" in (caught.value.fix or "")


def test_a_commit_revision_must_be_the_locked_commit(tmp_path: Path) -> None:
    lock = tmp_path / "site.lock"
    write_lock(lock, [LockedModel("acme/tiny", COMMIT, COMMIT, (LockedFile("a", 1, SHA),))])
    lock.write_text(lock.read_text().replace("commit: " + COMMIT, "commit: " + "c" * 40))
    with pytest.raises(BadInput, match="pins commit"):
        read_lock(lock)
