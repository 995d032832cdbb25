"""tools/mutate.py on a tiny repository in a temporary folder: it kills a mutant the tests see, reports a
survivor on an untested line, honours ``# no-mutate`` and the equivalents file, and never edits the source."""

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import mutate  # noqa: E402

TINY = '''\
def clamp(x, low, high):
    """Clamp x into [low, high]."""
    if x < low:
        return low
    return min(x, high)


def untested(a):
    return a * 2


def skipped(a):
    return a + 1  # no-mutate
'''

TEST = '''\
from tiny.core import clamp


def test_clamp():
    assert clamp(-1, 0, 10) == 0
    assert clamp(0, 0, 10) == 0
    assert clamp(5, 0, 10) == 5
    assert clamp(11, 0, 10) == 10
'''


def _repo(tmp_path: Path) -> Path:
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "__init__.py").write_text("")
    (tmp_path / "tiny" / "core.py").write_text(TINY)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_tiny.py").write_text(TEST)
    return tmp_path


def test_sites_cover_the_operators_and_skip_marked_lines(tmp_path):
    root = _repo(tmp_path)
    mutants = mutate.list_mutants(root, "tiny/core.py")
    keys = {m.key for m in mutants}
    assert "tiny/core.py:3: comparison: x < low → x <= low" in keys
    assert "tiny/core.py:5: swap call: min(x, high) → max(x, high)" in keys
    assert "tiny/core.py:9: arithmetic: a * 2 → a / 2" in keys
    assert "tiny/core.py:9: constant: 2 → 3" in keys
    assert "tiny/core.py:4: delete return value: return low → return" in keys
    assert not any(m.line == 13 for m in mutants)  # '# no-mutate'
    assert not any(m.line == 2 for m in mutants)   # docstring
    source = (root / "tiny/core.py").read_text()
    swapped = next(m for m in mutants if m.kind == "swap call")
    assert "return max(x, high)" in mutate.mutated_source(source, swapped.index)


def test_harness_kills_tested_mutants_and_reports_untested_survivors(tmp_path):
    root = _repo(tmp_path)
    (root / "tools").mkdir()
    (root / "tools" / "mutation_equivalent.txt").write_text(
        "# judged equivalent\ntiny/core.py:9: constant: 2 → 3  # example entry\n")
    before = (root / "tiny/core.py").read_text()
    result = subprocess.run([sys.executable, str(Path(mutate.__file__)), "tiny", "--root", str(root),
                             "--tests", "tests", "--timeout", "60"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "killed           " in out and "tiny/core.py:5: swap call: min(x, high) → max(x, high)" in out
    survivors = out.split("survivors (", 1)[1].split("marked equivalent", 1)[0]
    assert "tiny/core.py:9: arithmetic: a * 2 → a / 2" in survivors      # untested function
    assert "tiny/core.py:5: swap call" not in survivors                    # killed by test_clamp
    assert "tiny/core.py:3: comparison: x < low → x <= low" in survivors   # equivalent: x == low returns low either way
    assert "marked equivalent (1)" in out and "tiny/core.py:9: constant: 2 → 3" not in survivors
    total = next(line for line in out.splitlines() if line.startswith("total:"))
    killed, count = map(int, total.split()[1].split("/"))
    assert 0 < killed < count
    assert (root / "tiny/core.py").read_text() == before  # the source tree is never edited


def test_the_skip_file_leaves_its_lines_alone_and_matches_the_code(tmp_path):
    """Lines listed in tools/mutation_skip.txt are not mutated; every entry still names a line of its
    file (a stale entry fails here), and no marker is left in the production code."""
    root = _repo(tmp_path)
    (root / "tools").mkdir()
    (root / "tools" / "mutation_skip.txt").write_text("# comment\ntiny/core.py | return a * 2 | why\n")
    lines = {m.line for m in mutate.list_mutants(root, "tiny/core.py")}
    assert 9 not in lines and 3 in lines
    repo = Path(__file__).resolve().parents[2]
    skips = mutate.load_skips(repo / "tools" / "mutation_skip.txt")
    assert sum(len(codes) for codes in skips.values()) >= 30
    for path, codes in skips.items():
        present = {line.strip() for line in (repo / path).read_text(encoding="utf-8").splitlines()}
        assert codes <= present, (path, sorted(codes - present))
    for package in ("adaptplan", "profilers", "solvers", "trainers"):
        for source in (repo / package).rglob("*.py"):
            assert "no-mutate" not in source.read_text(encoding="utf-8"), source
