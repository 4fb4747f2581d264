"""The guided path through the docs: every page of docs/ ends with where to go next (a line
starting "Next:" whose links lead to existing files and headings), the README's Documentation
list starts with the tutorial, and every link of the tutorial and the troubleshooting page
resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.library.test_api_docs import anchors

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def link_problems(page: Path, text: str) -> list[str]:
    """The links of `text` (written in `page`) that lead nowhere: no such file or folder, or no
    such heading in the markdown file they name."""
    problems = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z]+:", target):
            continue  # an outside address
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            problems.append(f"{target}: no such file")
        elif anchor and (path.suffix != ".md" or anchor not in anchors(path.read_text())):
            problems.append(f"{target}: no such heading")
    return problems


def closing_paragraph(text: str) -> str:
    """The page's last paragraph, joined into one line."""
    return " ".join(text.rstrip().rsplit("\n\n", 1)[-1].split())


def test_the_path_covers_the_docs() -> None:
    names = {page.name for page in PAGES}
    assert {"tutorial.md", "troubleshooting.md", "faster.md", "api.md"} <= names
    assert len(PAGES) >= 17


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_page_ends_with_where_to_go_next(page: Path) -> None:
    last = closing_paragraph(page.read_text())
    assert last.startswith("Next: "), f"{page.name} ends with {last[:80]!r}, not a Next: line"
    links = LINK.findall(last)
    assert links, f"{page.name}'s Next: line links nowhere"
    assert all(link.partition("#")[0] != page.name for link in links), "Next: leads elsewhere"
    assert not link_problems(page, last)


@pytest.mark.parametrize("name", ["tutorial.md", "troubleshooting.md"])
def test_every_link_of_the_path_s_own_pages_resolves(name: str) -> None:
    page = DOCS / name
    assert not link_problems(page, page.read_text())


def test_the_readme_s_documentation_list_starts_with_the_tutorial() -> None:
    readme = (ROOT / "README.md").read_text()
    listed = readme[readme.index("\n## Documentation\n") :]
    first = next(line for line in listed.splitlines() if line.startswith("- "))
    assert first.startswith("- [docs/tutorial.md](docs/tutorial.md)")
    assert not link_problems(ROOT / "README.md", listed)


def test_one_test_for_a_full_history_turn() -> None:
    # `current.full_context` says whether `input` holds the whole history; `previous is None`
    # says whether a cached parent exists, which differs in drop-in and with forwarded ids.
    # No code of a page or an example tests it the other way, and prose names
    # `previous is None` only to say how the two differ.
    pages = [*PAGES, ROOT / "README.md"]
    for path in pages:
        text = path.read_text()
        for code in FENCE.findall(text):
            assert not re.search(r"\bprevious is None", code), f"{path.name}: {code}"
        for paragraph in FENCE.sub("", text).split("\n\n"):
            if re.search(r"\bprevious is None", paragraph):
                assert "differ" in paragraph, f"{path.name}: {paragraph}"
    for path in (ROOT / "examples").rglob("*.py"):
        assert not re.search(r"\bprevious is None", path.read_text()), path
    handlers = " ".join((DOCS / "handlers.md").read_text().split())
    rule = "The one test for a full-history turn is `current is None or current.full_context`"
    assert rule in handlers
