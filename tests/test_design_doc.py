"""Every `docs/DESIGN.md §N` citation in the repository names a section that exists there.

Docstrings, comments, scripts and the README point readers at sections of the design document;
a renumbered or deleted section must not leave them pointing at nothing.
"""

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DESIGN_DOC = "docs/DESIGN.md"
THIS_FILE = Path(__file__).resolve().relative_to(REPO).as_posix()  # its examples are not citations
CITING_SUFFIXES = (".py", ".sh", ".sbatch", ".md")

# "docs/DESIGN.md §4.1", and older forms such as "DESIGN §4.6" or "DESIGN.md 4.3"; not
# "DESIGN RULES" (a prompt heading) or "GAME_DESIGN_RULES" / "DESIGN_ID" (names).
CITATION = re.compile(r"\bDESIGN(?:\.md)?[ \t]+§?(\d+(?:\.\d+)*)")
# Further sections cited in the same parenthesis or line: "(docs/DESIGN.md §4.4 V5, §4.5)".
FURTHER_SECTION = re.compile(r"§(\d+(?:\.\d+)*)")
CANONICAL_PREFIX = "docs/DESIGN.md §"
HEADING = re.compile(r"^#{2,6}[ \t]+(\d+(?:\.\d+)*)[ \t]", re.MULTILINE)


def cited_sections(line: str) -> list[tuple[str, bool]]:
    """(section, written as `docs/DESIGN.md §N`) for every section a line cites."""
    found = []
    for match in CITATION.finditer(line):
        canonical = line[max(0, match.start() - len("docs/")):].startswith(CANONICAL_PREFIX)
        found.append((match.group(1), canonical))
        rest = line[match.end():]
        rest = rest[:rest.index(")")] if ")" in rest else rest
        found += [(section, canonical) for section in FURTHER_SECTION.findall(rest)]
    return found


def section_headings(doc_text: str) -> list[str]:
    """Section numbers of the document's numbered headings (`## 4 ...`, `### 4.1 ...`)."""
    return HEADING.findall(doc_text)


def citing_files() -> list[str]:
    """Tracked files that may cite the design document (the document and this file excluded)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                                check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"not a git checkout, so tracked files are unknown: {err}")
    return [path for path in listed.split("\0")
            if path.endswith(CITING_SUFFIXES) and path not in (DESIGN_DOC, THIS_FILE)]


def all_citations() -> list[tuple[str, int, str, bool]]:
    """(file, line number, section, canonical) of every citation in the citing files."""
    citations = []
    for path in citing_files():
        text = (REPO / path).read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            citations += [(path, number, section, canonical)
                          for section, canonical in cited_sections(line)]
    return citations


def dangling(citations, sections) -> list[str]:
    """`file:line §N` of every citation whose section is not among `sections`."""
    known = set(sections)
    return [f"{path}:{number} §{section}" for path, number, section, _ in citations
            if section not in known]


def design_text() -> str:
    return (REPO / DESIGN_DOC).read_text(encoding="utf-8")


def test_the_citation_pattern_reads_every_form_in_use():
    assert cited_sections("(docs/DESIGN.md §4.1).") == [("4.1", True)]
    assert cited_sections("(docs/DESIGN.md §4.4 V5, §4.5)") == [("4.4", True), ("4.5", True)]
    assert cited_sections("(docs/DESIGN.md §3 and §4.1)") == [("3", True), ("4.1", True)]
    assert cited_sections("DESIGN §4.6 and later §9") == [("4.6", False), ("9", False)]
    assert cited_sections("the contract of DESIGN.md 4.3. The") == [("4.3", False)]
    assert cited_sections("(DESIGN 4.2: <= 3/4 max_turns)") == [("4.2", False)]
    for not_a_citation in ('"DESIGN RULES"', "GAME_DESIGN_RULES = 1", "DESIGN_ID = 3",
                           "DESIGN = {design!r}", "see §4.1 of the paper"):
        assert cited_sections(not_a_citation) == [], not_a_citation


def test_every_cited_section_exists():
    citations = all_citations()
    # At least the loop, the contract and the README cite it: a pattern that matched nothing
    # would make the check below pass vacuously.
    assert len(citations) >= 10, citations
    missing = dangling(citations, section_headings(design_text()))
    assert not missing, f"cited sections missing from {DESIGN_DOC}: {missing}"


def test_citations_name_the_file_by_its_path():
    bare = [f"{path}:{number} §{section}" for path, number, section, canonical in all_citations()
            if not canonical]
    assert not bare, f"write these citations as '{CANONICAL_PREFIX}N': {bare}"


def test_section_numbers_are_unique():
    sections = section_headings(design_text())
    assert len(sections) == len(set(sections)), sorted(sections)


def test_a_removed_heading_is_reported():
    """The check has teeth: the loop's §4.6 citation dangles once §4.6's heading is gone."""
    text = design_text()
    without = re.sub(r"^### 4\.6 .*\n", "", text, count=1, flags=re.MULTILINE)
    assert without != text
    missing = dangling(all_citations(), section_headings(without))
    assert any(entry.startswith("spade_jax/spade/loop.py:") and entry.endswith("§4.6")
               for entry in missing), missing
