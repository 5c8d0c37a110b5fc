"""The README's claims about what is built stay in step with the docs (issue 42): a feature the
README calls not built (not enforced, designed only) is one its linked docs page says is not
built, and a docs page whose opening says its feature is not built is not sold as built by the
README; the layout section names what the repository holds; the suite's figures are the ones
docs/testing.md records."""

from __future__ import annotations

import re
import subprocess

from tests.support.readme import README, section
from tests.support.sites import REPO

DOCS = REPO / "docs"
# "not built", "not yet enforced", "designed, not built", "not done", "not implemented"
NOT_BUILT = re.compile(r"\bnot (?:yet )?(?:built|enforced|implemented|done)\b|"
                       r"\bdesigned, not\b", re.I)
LINK = re.compile(r"\(docs/([a-z0-9_-]+\.md)(?:#[a-z0-9-]+)?\)")
WORD = re.compile(r"[a-z][a-z_-]{3,}")
# words that say nothing about which feature a statement is about
COMMON = {"this", "that", "with", "what", "which", "when", "they", "them", "their", "there",
          "here", "only", "built", "designed", "enforced", "implemented", "done", "stored",
          "yet", "from", "into", "each", "every", "page", "says", "kit's"}


def paragraphs(text: str) -> list[str]:
    """Paragraphs and list items (a bullet is its own statement), code blocks left out."""
    text = re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S)
    return [part.strip() for part in re.split(r"\n\s*\n|\n(?=- )", text) if part.strip()]


def subjects(text: str) -> set[str]:
    """A statement's content words, crudely singular ('budgets' and 'budget' are one)."""
    return {word.removesuffix("s") for word in WORD.findall(text.lower())} - COMMON


def not_built_clauses(statement: str) -> list[str]:
    """The clause of each not-built phrase: from the last `;`, `.` or `(` before it, and what
    follows it when it introduces a list (`not done: …`, up to `)`, `;` or `. `)."""
    clauses = []
    for match in NOT_BUILT.finditer(statement):
        start = max(statement.rfind(mark, 0, match.start()) for mark in (";", ". ", "("))
        end = match.end()
        if statement[end:end + 1] == ":":
            ends = [i for i in (statement.find(m, end) for m in (")", ";", ". ")) if i != -1]
            end = min(ends, default=len(statement))
        clauses.append(statement[start + 1:end])
    return clauses


def doc_not_built(page: str) -> list[str]:
    """What a docs page says is not built: its sentences saying so, and every line of its
    `## Not done` section."""
    text = (DOCS / page).read_text()
    found = [clause for part in paragraphs(text) for clause in not_built_clauses(part)]
    for heading in re.finditer(r"^## Not done.*$", text, flags=re.M):
        end = text.find("\n## ", heading.end())
        found.append(text[heading.end():None if end == -1 else end])
    return found


def test_each_not_built_claim_of_the_readme_is_the_linked_pages_too() -> None:
    claims = [(statement, clause) for statement in paragraphs(README.read_text())
              for clause in not_built_clauses(statement)]
    assert claims, "the README names nothing as not built: then this test checks nothing"
    for statement, clause in claims:
        pages = LINK.findall(statement)
        assert pages, f"README: {clause!r} links no docs page that says so"
        said = [doc for page in pages for doc in doc_not_built(page)]
        assert any(subjects(clause) & subjects(doc) for doc in said), (
            f"README says {clause!r}, but {', '.join(pages)} says nothing of it is not built "
            f"(what it does call not built: {said})")


def test_a_page_that_opens_with_not_built_is_not_sold_as_built() -> None:
    """A page whose title or first paragraph says its feature is not built: every README
    statement that links it says so too."""
    statements = paragraphs(README.read_text())
    for page in sorted(DOCS.glob("*.md")):
        title, first, *_ = paragraphs(page.read_text())
        if not NOT_BUILT.search(title + "\n" + first) or "what is built" in first:
            continue
        for statement in statements:
            if f"(docs/{page.name}" in statement:
                assert NOT_BUILT.search(statement), (
                    f"{page.name} opens with what is not built; the README sells it: "
                    f"{statement!r}")


def test_the_statement_finder_can_fail() -> None:
    """The README's old words, against docs/policy.md and docs/sleep.md as they are now."""
    old = ("- Per-credential policy: enforced at the door ([docs/policy.md](docs/policy.md)); "
           "budgets are stored, not yet enforced.")
    [clause] = not_built_clauses(old)
    assert clause.strip() == "budgets are stored, not yet enforced"
    assert not any(subjects(clause) & subjects(doc) for doc in doc_not_built("policy.md"))
    old = ("- sleeping on idle and waking on a request are designed, not built "
           "([docs/sleep.md](docs/sleep.md)).")
    [clause] = not_built_clauses(old)
    assert not any(subjects(clause) & subjects(doc) for doc in doc_not_built("sleep.md"))


def test_the_layout_names_what_the_repository_holds() -> None:
    layout = section("Layout")
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    top = {path.split("/")[0] for path in tracked if "/" in path}
    for folder in top:
        assert re.search(rf"(^|\s){re.escape(folder)}/", layout), f"layout misses {folder}/"
    for page in sorted(DOCS.glob("*.md")):
        assert page.name in layout, f"layout misses docs/{page.name}"
    kit_line = layout[layout.index("\nkit/"):layout.index("\ntemplates/")]
    for name in re.findall(r"\b([a-z_]+)/(?=\s)", kit_line.removeprefix("\nkit/")):
        assert (REPO / "kit" / name).is_dir(), f"layout names kit/{name}/, which is not there"
    for name in re.findall(r"\b([a-z_]+\.py)\b", kit_line):
        assert (REPO / "kit" / name).is_file(), f"layout names kit/{name}, which is not there"
    for name in re.findall(r"[\w.-]+\.(?:j2|js|py|sh)\b", layout[layout.index("\ntemplates/"):]):
        assert any(path.endswith("/" + name) for path in tracked), f"layout names {name}"


def test_the_suite_figures_are_the_ones_docs_testing_records() -> None:
    """One owner of the suite's measured time and size: docs/testing.md."""
    text = README.read_text()
    testing = (DOCS / "testing.md").read_text()
    count = re.search(r"The whole suite \(([\d,]+) passed", text)
    minutes = re.search(r"took ([\d.]+) min on \d cores", text)
    assert count and minutes, "the README's suite figures moved: keep them checkable"
    assert f"{count[1]} passed" in testing and f"{minutes[1]} min" in testing
    one_worker = re.search(r"1 took\s+([\d.]+) min", text)
    assert one_worker and f"took {one_worker[1]} min" in testing
