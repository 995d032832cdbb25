"""The README gives exactly two set-up commands, and .ci/run runs exactly those."""

from pathlib import Path

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
