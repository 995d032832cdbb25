"""The README gives exactly two set-up commands, and .ci/run runs exactly those."""

import re
from pathlib import Path

import pytest

from tests.readme_blocks import bash_blocks, readme_section

ROOT = Path(__file__).resolve().parents[2]


def readme_setup_commands() -> list[str]:
    return bash_blocks(readme_section("Set-up"))


def test_readme_has_exactly_two_setup_commands():
    commands = readme_setup_commands()
    assert len(commands) == 2
    assert all("\n" not in c for c in commands)
    assert commands[0].endswith("adaptplan plan")
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_commands_verbatim():
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in readme_setup_commands():
        assert command in ci_lines


def test_the_readmes_resume_list_is_the_options_a_resumed_run_may_change() -> None:
    """Issue 25, first-hour item 6: docs/usage.md's list of flags allowed with --resume is
    trainers.run.driver.RESUMABLE."""
    import re

    from adaptplan.cli.commands.train import flag_of
    from trainers.run.driver import RESUMABLE

    text = (Path(__file__).resolve().parents[2] / "docs" / "usage.md").read_text(encoding="utf-8")
    sentence = text[text.index("only `--rounds`"):text.index("may be given anew")]
    listed = set(re.findall(r"`(--[a-z-]+)`", sentence))
    allowed = {flag_of(name) for name in RESUMABLE} - {"--resume", "--overwrite", "--out"}
    assert listed == allowed


def test_the_readme_is_a_newcomers_page_and_names_every_doc() -> None:
    """Issue 37 item 7: under 12 kB, and its documentation list names every page of docs/."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "README.md").read_text(encoding="utf-8")
    assert len(text.encode()) < 12_000
    pages = {p.name for p in (root / "docs").glob("*.md")}
    index = text.split("\n## Documentation", 1)[1].split("\n## ", 1)[0]
    assert {p for p in pages if f"docs/{p}" not in index} == set()


def test_the_bench_help_line_names_every_benchmark(capsys) -> None:
    from adaptplan.cli import build_parser

    parser = build_parser()
    bench = next(a for a in parser._subparsers._group_actions[0]._choices_actions if a.dest == "bench")
    for name in ("solvers", "engine", "algorithms", "training", "papers"):
        assert name in bench.help


def test_the_readmes_quick_tier_figures_are_the_scripts_sentence() -> None:
    """Issue 37 item 6: the README's figures are written by tools/readme_figures.py between its markers, in the form
    that script writes (counts, time, cores, date); the rewrite keeps everything around them."""
    import datetime as dt
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "tools" / "readme_figures.py")
    figures = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(figures)
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    part = text.split(figures.START)[1].split(figures.END)[0]
    quick, total = figures.counts_in(text)
    assert 0 < quick < total
    assert re.fullmatch(r"\([\d,]+ of [\d,]+ tests in (\d+ min )?\d+ s on \d+ cores, \d{4}-\d\d-\d\d; measured by "
                        r"tools/readme_figures\.py\)", part)
    new = figures.sentence(1641, 1808, 140.4, 2, dt.date(2026, 11, 27))
    assert new == "(1,641 of 1,808 tests in 2 min 20 s on 2 cores, 2026-11-27; measured by tools/readme_figures.py)"
    rewritten = figures.rewrite(text, figures.sentence(7, 9, 42.0, 2, dt.date(2027, 1, 2)))
    assert figures.counts_in(rewritten) == (7, 9) and "(7 of 9 tests in 42 s on 2 cores, 2027-01-02;" in rewritten
    assert rewritten.replace(figures.sentence(7, 9, 42.0, 2, dt.date(2027, 1, 2)), part) == text
    with pytest.raises(ValueError):
        figures.rewrite("no markers", new)
