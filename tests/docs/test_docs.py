"""The project's documents stand on their own: every link and every path they name is in
the repository, nothing points outside it, and the key layout (a public contract the
README documents) reads the same in the README and in docs/design.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = [p for d in ("ctp_state", "dags", "spark_apps", "expectations", "scripts") for p in (ROOT / d).rglob("*.py")]


def _layout_block(text: str) -> str:
    start = text.index("\ncluster/epoch/hint")
    return text[start : text.index("```", start)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve_inside_the_repository(doc: Path) -> None:
    text = doc.read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    if doc.name in ("README.md", "design.md"):
        assert local, f"{doc.name}: no links found (did the pattern break?)"
    for link in local:
        target = (doc.parent / link).resolve()
        assert target.is_relative_to(ROOT), f"{doc.name} links outside the repository: {link}"
        assert target.exists(), f"{doc.name} links to a missing file: {link}"


@pytest.mark.parametrize("path", DOCS + SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_points_at_the_teams_internal_material(path: Path) -> None:
    text = path.read_text()
    for needle in ("../shared", "DESIGN.md", "STACK.md", "STYLE.md", "DESIGN 2"):
        assert needle not in text, f"{path.relative_to(ROOT)} mentions {needle!r}"


def test_every_path_the_design_names_exists() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    paths = set(re.findall(r"`((?:ctp_state|tests|dags|spark_apps|expectations|scripts|benchmarks)/[\w/.-]*)", text))
    assert len(paths) > 20, sorted(paths)
    missing = [p for p in sorted(paths) if not (ROOT / p.split("::")[0]).exists()]
    assert not missing, f"docs/design.md names paths that do not exist: {missing}"


def test_the_design_names_real_tests() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    names = set(re.findall(r"`(test_\w+)`", text)) | set(re.findall(r"::(test_\w+)", text))
    assert names
    corpus = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    missing = [n for n in sorted(names) if f"def {n}(" not in corpus]
    assert not missing, f"docs/design.md names tests that do not exist: {missing}"


def test_the_key_layout_reads_the_same_in_readme_and_design() -> None:
    readme = _layout_block((ROOT / "README.md").read_text())
    design = _layout_block((ROOT / "docs" / "design.md").read_text())
    assert readme == design
    assert "l0/<spread:03d>/<epoch:018d>/<uuid>.l0" in readme


def test_every_rule_and_invariant_is_in_the_design() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    for name in [f"R{i}" for i in range(1, 12)] + [f"I{i}" for i in range(1, 8)]:
        assert f"**{name}" in text, f"docs/design.md does not state {name}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_tables_are_not_cut_by_a_blank_line(doc: Path) -> None:
    """A table row after a blank line starts a new table, which needs its own header and
    separator: a row without them is a table some edit cut in two."""
    lines = doc.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and (i == 0 or not lines[i - 1].strip()):
            assert i + 1 < len(lines) and re.match(r"\|\s*:?-+", lines[i + 1]), f"{doc.name}:{i + 1}: {line[:60]}"
