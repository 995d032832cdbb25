"""tools/hand_mutants.py: the project's hand-written mutants still apply to the code (each ``find`` once, each test
path there, at least 60 of them in the five classes of issue 68 item 6), and the runner, on a tiny repository,
kills a mutant its tests see, reports a survivor, and calls a mutant whose tests do not run an error, never a kill."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import hand_mutants  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_every_hand_written_mutant_applies_to_the_code() -> None:
    mutants = hand_mutants.load()
    assert hand_mutants.problems(ROOT, mutants) == []
    assert len(mutants) >= 60
    assert {m.kind for m in mutants} == set(hand_mutants.CLASSES)


def _tiny(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "__init__.py").write_text("")
    (root / "tiny" / "core.py").write_text("def held(n, f):\n    return int(f * n + 1e-9)\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_core.py").write_text(
        "from tiny.core import held\n\n\ndef test_held():\n    assert held(100, 0.29) == 29\n")
    return root


def test_the_runner_kills_reports_survivors_and_errors(tmp_path: Path) -> None:
    root = _tiny(tmp_path)
    M = hand_mutants.HandMutant
    mutants = [M("no-epsilon", "edge", "tiny/core.py", " + 1e-9", "", "tests/test_core.py", "0.29 × 100 = 28.99…"),
               M("harmless", "edge", "tiny/core.py", "int(", "int(0 + ", "tests/test_core.py", "adds 0"),
               M("no-tests", "edge", "tiny/core.py", "int(", "round(", "tests/test_nothing.py", "no test file")]
    assert hand_mutants.problems(root, mutants) == ["no-tests: no test path tests/test_nothing.py"]
    results = hand_mutants.run(root, mutants, sys.executable, timeout=120)
    assert [(m.id, outcome) for m, outcome, _ in results] == [("no-epsilon", "fail"), ("harmless", "pass"),
                                                              ("no-tests", "error")]
    assert (root / "tiny" / "core.py").read_text() == "def held(n, f):\n    return int(f * n + 1e-9)\n"   # untouched
    text = hand_mutants.score(results)
    assert "total: 1/3 killed = 33.3%" in text and "SURVIVED harmless" in text and "ERROR (tests do not run) no-tests" in text
    shutil.rmtree(root)
