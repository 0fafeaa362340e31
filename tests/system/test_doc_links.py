"""Every relative link in the README and docs/*.md leads somewhere in the repository: the file (or folder) exists
inside it, not only beside a checkout (CI's clean clone has nothing outside it), and a ``#anchor`` names a heading of
the target (GitHub's slugs). A Markdown file named in code (```docs/TESTING.md```) exists too. Links to the web are
not followed."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
MD_IN_CODE = re.compile(r"`([\w./-]+\.md)`")  # a Markdown file named in a code span, e.g. `docs/CLAIMS.md`


def prose_lines(text: str, code_spans: bool = False) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks; inline code spans blanked out unless ``code_spans``."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line if code_spans else re.sub(r"`[^`]*`", "``", line)))
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every inline link and image in ``path`` that is not a URL or a mail address."""
    found = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for pattern in (LINK, IMAGE):
            found += [(number, m.group(1)) for m in pattern.finditer(line)]
    return [(n, t) for n, t in found if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (links reduced to their text), lower case, punctuation dropped
    (word characters, spaces and hyphens kept), spaces turned into hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a Markdown file offers: its headings' slugs (repeats numbered -1, -2, as GitHub does) and
    explicit ``<a name=...>`` / ``id=`` anchors."""
    seen: dict[str, int] = {}
    out = set()
    text = path.read_text(encoding="utf-8")
    for _, line in prose_lines(text, code_spans=True):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            out.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    out |= set(HTML_ANCHOR.findall(text))
    return out


def broken(path: Path) -> list[str]:
    """What is wrong with ``path``'s relative links, one line each (empty when every link resolves)."""
    problems = []
    for number, target in links(path):
        where, _, anchor = unquote(target).partition("#")
        dest = (path.parent / where).resolve() if where else path
        name = f"{path.relative_to(REPO)}:{number}: ({target})"
        if not dest.is_relative_to(REPO):
            problems.append(f"{name} points outside the repository ({dest}): a clean clone does not have it")
        elif not dest.exists():
            problems.append(f"{name}: {dest.relative_to(REPO)} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{name}: {dest.relative_to(REPO)} has no heading #{anchor}")
    for number, line in prose_lines(path.read_text(encoding="utf-8"), code_spans=True):
        for named in MD_IN_CODE.findall(line):  # relative to the page, or to the repository's root
            if not any((base / named).resolve().is_relative_to(REPO) and (base / named).exists()
                       for base in (path.parent, REPO)):
                problems.append(f"{path.relative_to(REPO)}:{number}: `{named}` names a file the repository does not "
                                "have: link to one it has, or describe it without a file name")
    return problems


def test_the_link_reader_sees_links_anchors_and_mistakes(tmp_path, monkeypatch):
    """The checker itself: it finds relative links (not URLs, not code), GitHub's heading slugs, and each kind of
    broken link."""
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "B.md").write_text("# The `make test` target: all of it\n## Again\n## Again\n")
    page = tmp_path / "README.md"
    page.write_text("See [b](docs/B.md#the-make-test-target-all-of-it), [twice](docs/B.md#again-1), [web](https://x.y),"
                    " `[code](nowhere.md)`,\n[gone](docs/C.md), [no heading](docs/B.md#nope), [out](../elsewhere.md)\n"
                    "```\n[fenced](nowhere.md)\n```\nRead `docs/B.md` and `RULES.md`.\n")
    assert [t for _, t in links(page)] == ["docs/B.md#the-make-test-target-all-of-it", "docs/B.md#again-1",
                                           "docs/C.md", "docs/B.md#nope", "../elsewhere.md"]
    problems = broken(page)
    assert len(problems) == 4, problems
    assert "does not exist" in problems[0] and "no heading #nope" in problems[1] and "outside" in problems[2]
    assert "`RULES.md` names a file" in problems[3]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path):
    assert not broken(path), "\n".join(broken(path))
