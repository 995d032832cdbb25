"""The README's Python snippets run as written, in a folder holding the files they load, under the
names the README's "Using it" commands write them (tests/project/test_readme_using_it.py runs those)."""

import re
from pathlib import Path

import pytest

from adaptplan import ConvergenceConstants, generate_system
from adaptplan.scenarios import default_profile

ROOT = Path(__file__).resolve().parents[2]


def python_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_python_snippets():
    assert python_snippets()


@pytest.mark.parametrize("index", range(len(python_snippets())))
def test_readme_python_snippet_runs_as_written(index, tmp_path, monkeypatch):
    profile = default_profile()                                    # like `adaptplan profile ... -o profile.json`
    profile.save(tmp_path / "profile.json")
    generate_system(20, seed=0).save(tmp_path / "system.json")    # `adaptplan system --devices 20 --seed 0 -o ...`
    ConvergenceConstants.placeholder(profile.num_cuts).save(tmp_path / "constants.json")
    monkeypatch.chdir(tmp_path)
    exec(compile(python_snippets()[index], f"README.md python snippet {index + 1}", "exec"), {"__name__": "__readme__"})
