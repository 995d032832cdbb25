"""References in code, tests, --help and README point into docs/, and what they point at exists there."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for d in ("adaptplan", "profilers", "solvers", "trainers", "examples", "benchmarks") for p in (ROOT / d).rglob("*.py")]
SOURCES += [p for p in (ROOT / "tests").rglob("*.py") if p.name != "test_docs.py"]   # tests cite the docs too
SOURCES += [ROOT / "README.md"]


def texts():
    return {p.relative_to(ROOT): p.read_text(encoding="utf-8") for p in SOURCES}


def test_no_reference_outside_the_repository():
    stale = re.compile(r"DESIGN\.md|shared/spec|spec/|(?<!docs/)\bformats\.md|(?<!docs/)\bmodel\.md|"
                       r"gapsl_scala|cyclesl_gas|\bspec §|adaptsfl\.md")
    found = [f"{path}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}"
             for path, text in texts().items() for m in stale.finditer(text)]
    assert not found, found


def test_referenced_docs_and_model_sections_exist():
    headings = {m.group(1) for m in re.finditer(r"^#+ §(\d+(?:\.\d+)?)", (ROOT / "docs" / "model.md").read_text(), re.M)}
    for path, text in texts().items():
        for name in re.findall(r"docs/(\w+)\.md", text):
            assert (ROOT / "docs" / f"{name}.md").exists(), f"{path} cites docs/{name}.md"
        for section in re.findall(r"docs/model\.md §(\d+(?:\.\d+)?)", text):
            assert section in headings, f"{path} cites docs/model.md §{section}"
