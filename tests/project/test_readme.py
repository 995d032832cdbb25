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
    trainers.config.train_config.RESUMABLE (what trainers.run.resume_check lets a resumed run change)."""
    import re

    from adaptplan.cli.commands.train import flag_of
    from trainers.config.train_config import RESUMABLE

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


def test_the_environments_size_is_the_scripts_sentence(tmp_path) -> None:
    """Issue 65 item 5: docs/usage.md's environment size is written by tools/readme_figures.py (the set-up notes said
    "about 3 GB" of an environment of 6.3 GB): the sentence's form, and the sizes it adds up on a made-up prefix."""
    import datetime as dt
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "tools" / "readme_figures.py")
    figures = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(figures)
    usage = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    part = usage.split(figures.ENVIRONMENT)[1].split(figures.END)[0]
    assert re.fullmatch(r"\d+\.\d GB, \d+\.\d GB of it CUDA libraries, \d{4}-\d\d-\d\d; measured by "
                        r"tools/readme_figures\.py", part), part
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    for name, size in (("nvidia/cublas/lib.so", 3_000), ("triton/x.so", 500), ("cuda/b.so", 20), ("torch/t.so", 1_000),
                       ("nvidia_cublas-1.dist-info/RECORD", 7), ("numpy/n.so", 100)):
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(b"x" * size)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_bytes(b"x" * 9)
    assert figures.environment_sizes(tmp_path) == (4_636, 3_520)
    sentence = figures.environment_sentence(6_712_000_000, 4_260_000_000, dt.date(2026, 12, 4))
    assert sentence == "6.7 GB, 4.3 GB of it CUDA libraries, 2026-12-04; measured by tools/readme_figures.py"
    rewritten = figures.rewrite(usage, sentence, figures.ENVIRONMENT)
    assert rewritten.replace(sentence, part) == usage
    assert figures.rewrite(rewritten, part, figures.ENVIRONMENT) == usage
