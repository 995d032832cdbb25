"""Issue 68 item 2: a new algorithm is one strategy file, one registry entry, one docs section and its own test file.

A copy of the repository gets exactly those four changes for a toy algorithm (PSL under another name with an option
of its own); the registry-driven tests of the copy then run, and must pass with the toy among the algorithms they
enumerate — no test names the algorithms it covers, so none has to be edited. The copy is a temporary folder; the
repository is never changed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STRATEGY = '''"""Toy: PSL under another name (tests/project/test_new_algorithm.py), with one option of its own."""

from __future__ import annotations

from trainers.api import Strategy


class Toy(Strategy):
    name = "toy"
    averages_clients = False

    def __init__(self, participation: float = 1.0, toy_rounds: int = 1) -> None:
        super().__init__(participation)
        self.toy_rounds = toy_rounds
'''

ENTRY = '''    Algorithm("toy", "trainers.strategies.toy:Toy", "a toy: PSL under another name", TrainingDefaults(
                  **_PSL_FAMILY, source="a test"),
              (PARTICIPATION, Option("toy_rounds", int, 1, "a toy option, in rounds", unit="rounds"))),
'''

SECTION = '''
## Toy

PSL under another name, added by tests/project/test_new_algorithm.py to a copy of the repository.
'''

OWN_TEST = '''from trainers.strategies import make_strategy


def test_the_toy_takes_its_option() -> None:
    assert make_strategy("toy", {"toy_rounds": 3}).toy_rounds == 3
'''

REGISTRY_DRIVEN = [            # whole files that read the registry
    "tests/trainers/test_algorithm_registry.py",
    "tests/trainers/config/test_train_config.py",
    "tests/project/test_docs.py",
    "tests/trainers/strategies/test_toy.py",
]
PARAMETRISED = [               # files with tests parametrised by the registry's algorithms: the toy's cases
    "tests/trainers/strategies/test_strategies.py",
    "tests/trainers/engine/test_engine_memory.py",
    "tests/adaptplan/cli/test_train_cli.py",
]


def _copy_repository(to: Path) -> None:
    """The repository's files as git sees them (tracked, and new files it does not ignore)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)


def _add_the_toy(repo: Path) -> None:
    (repo / "trainers" / "strategies" / "toy.py").write_text(STRATEGY, encoding="utf-8")
    registry = repo / "trainers" / "algorithms.py"
    text = registry.read_text(encoding="utf-8")
    end = text.index("\n)}", text.index("REGISTRY"))          # the registry's closing line
    registry.write_text(text[:end + 1] + ENTRY + text[end + 1:], encoding="utf-8")
    with open(repo / "docs" / "algorithms.md", "a", encoding="utf-8") as docs:
        docs.write(SECTION)
    (repo / "tests" / "trainers" / "strategies" / "test_toy.py").write_text(OWN_TEST, encoding="utf-8")


def _pytest(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(repo), "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-p",
                           "no:warnings", "-m", "not slow", *args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=900)


def test_a_toy_algorithm_in_four_files_is_taken_by_the_registry_driven_tests(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _copy_repository(repo)
    _add_the_toy(repo)
    probe = subprocess.run([sys.executable, "-c", "import trainers.algorithms as a; print(a.__file__, a.ALGORITHMS)"],
                           cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, capture_output=True, text=True)
    assert probe.stdout.startswith(str(repo)) and "'toy'" in probe.stdout, probe.stdout + probe.stderr
    whole = _pytest(repo, *REGISTRY_DRIVEN)
    assert whole.returncode == 0, whole.stdout[-4000:]
    toy = _pytest(repo, *PARAMETRISED, "-k", "toy", "-rA")
    assert toy.returncode == 0, toy.stdout[-4000:]
    ran = re.findall(r"^PASSED (\S+\[toy\])", toy.stdout, flags=re.M)
    assert {name.split("::")[0] for name in ran} == set(PARAMETRISED), toy.stdout[-4000:]
