"""No development history inside the project: the code, its tests and its documents state what
holds and why, not which work period or numbered issue found it.  The pattern is the one a reader
would grep for (case-insensitive): the word for a work period (:data:`SITTING`), or "issue"
followed by a number."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITTING, TICKET = "sess" + "ion", "iss" + "ue"  # split: this file passes its own test
HISTORY = re.compile(SITTING + "|" + TICKET + " [0-9]|" + TICKET + " #?[0-9]", re.IGNORECASE)
TEXT = {".py", ".md", ".json", ".txt", ".sh", ".cfg", ".ini", ".toml", ".yml", ".yaml", ".rst", ""}

CODE = ("semimig", "kernels", "benchmarks", "tests", "examples")
CODE_OWNED_ELSEWHERE: dict[str, str] = {}
"""Folders exempt from the check (folder → why); empty: every folder is checked."""
DOCS_OWNED_ELSEWHERE: dict[str, str] = {}
"""Documents exempt from the check (path → why); empty: every document is checked."""


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in TEXT
                  and "__pycache__" not in p.parts and not p.name.startswith("."))


def _hits(paths) -> list[str]:
    hits = []
    for path in paths:
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if HISTORY.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    return hits


def _docs() -> list[str]:
    return ["README.md"] + [p.relative_to(ROOT).as_posix() for p in _files(ROOT / "docs")]


@pytest.mark.parametrize("document", [
    pytest.param(d, marks=pytest.mark.xfail(strict=False, reason=DOCS_OWNED_ELSEWHERE[d]))
    if d in DOCS_OWNED_ELSEWHERE else d for d in _docs()])
def test_the_documents_hold_no_development_history(document):
    assert _hits([ROOT / document]) == []


@pytest.mark.parametrize("folder", [
    pytest.param(f, marks=pytest.mark.xfail(strict=False, reason=CODE_OWNED_ELSEWHERE[f]))
    if f in CODE_OWNED_ELSEWHERE else f for f in CODE])
def test_the_code_and_tests_hold_no_development_history(folder):
    hits = _hits(_files(ROOT / folder))
    assert hits == [], f"{len(hits)} line(s), e.g.\n" + "\n".join(hits[:20])


def test_the_pattern_finds_what_it_should_and_nothing_else():
    assert HISTORY.search(f"found in the third {SITTING.title()}") and HISTORY.search(f"see {TICKET} 27")
    assert HISTORY.search(f"{TICKET.title()} #30") and HISTORY.search(f"({TICKET} 4)")
    assert not HISTORY.search("an issue with the plan") and not HISTORY.search("issued 4 calls")
