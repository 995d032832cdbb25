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


def _section(text: str, heading: str) -> str:
    """The lines of ``text`` under ``heading`` (a whole heading line) up to the next heading."""
    return text.split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0]


def _table_rows(section: str) -> list[list[str]]:
    """The cells of a markdown table's body rows (the header and the rule left out)."""
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def test_the_architecture_page_is_read_in_one_sitting() -> None:
    """Issue 68 item 5: docs/architecture.md under 30 kB; the engine's detail is docs/engine.md, the measurements
    docs/measured.md."""
    assert len((ROOT / "docs" / "architecture.md").read_bytes()) < 30_000


def test_every_algorithm_of_the_registry_is_documented_and_the_strategy_table_names_no_other() -> None:
    """Each registered algorithm is a row of architecture.md's strategy table (the papers' at a glance) or has its own
    section in docs/algorithms.md ("## NAME — ..."): an algorithm added later writes one section (issue 68 item 2)."""
    from trainers.algorithms import ALGORITHMS

    def key(name: str) -> str:
        return re.sub(r"[^a-z0-9]", "", name.lower())

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = {key(row[0]) for row in _table_rows(_section(text, "## Strategies (`trainers/api.py`, `trainers/strategies/`)"))}
    sections = {key(m.group(1)) for m in re.finditer(r"^## (\S+)", (ROOT / "docs" / "algorithms.md").read_text(
        encoding="utf-8"), flags=re.M)}
    registered = {key(a) for a in ALGORITHMS}
    assert rows <= registered, rows - registered
    assert registered <= rows | sections, registered - rows - sections
    assert {"sl", "psl", "sflv1", "sflv2", "adaptsfl", "gapsl", "scala", "cyclesl", "gas", "sglr"} <= rows


def test_the_configuration_table_names_every_field_of_every_part() -> None:
    import dataclasses

    from trainers.config import train_config

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = {}
    for part, cls, fields in _table_rows(_section(text, "### A run's configuration, by part")):
        names = re.sub(r"\s*\([^)]*\)", "", fields.split(";")[0])
        table[part.strip("`")] = (cls.strip("`"), [name.strip() for name in names.split(",")])
    parts = [f.name for f in dataclasses.fields(train_config.TrainConfig) if f.name not in ("algorithm", "extra")]
    assert list(table) == parts
    for part, (cls, names) in table.items():
        assert names == [f.name for f in dataclasses.fields(getattr(train_config, cls))], part


def test_links_into_the_engine_page_name_its_sections() -> None:
    """architecture.md's links ``engine.md#anchor`` point at headings of docs/engine.md (GitHub's anchors)."""
    engine = (ROOT / "docs" / "engine.md").read_text(encoding="utf-8")
    anchors = {re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
               for m in re.finditer(r"^#+ (.+)$", engine, re.M)}
    links = re.findall(r"\]\(engine\.md#([\w-]+)\)", (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert links and set(links) <= anchors, set(links) - anchors
