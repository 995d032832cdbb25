"""docs/architecture.md's layering rules, checked on the source: solvers never import torch; solvers and
profilers never import trainers; nothing imports the CLI; adaptplan's world model is torch-free."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def roots(names: set[str]) -> set[str]:
    return {name.split(".")[0] for name in names}


@pytest.mark.parametrize("path", sources("solvers"), ids=lambda p: p.name)
def test_solvers_import_neither_torch_nor_trainers(path):
    assert not roots(imported_modules(path)) & {"torch", "torchvision", "trainers", "profilers", "fvcore"}


@pytest.mark.parametrize("path", sources("profilers"), ids=lambda p: p.name)
def test_profilers_never_import_trainers(path):
    assert "trainers" not in roots(imported_modules(path))


@pytest.mark.parametrize("path", [p for pkg in ("adaptplan", "profilers", "solvers", "trainers") for p in sources(pkg)
                                  if p.name != "cli.py"], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_nothing_imports_the_cli(path):
    assert "adaptplan.cli" not in imported_modules(path)


WORLD_MODEL = ["__init__.py", "constants.py", "convergence.py", "errors.py", "fileio.py", "latency.py", "lazy.py",
               "model_profile.py", "plan.py", "planner.py", "report.py", "scenarios.py", "system.py"]


@pytest.mark.parametrize("name", WORLD_MODEL)
def test_world_model_is_torch_free(name):
    assert not roots(imported_modules(ROOT / "adaptplan" / name)) & {"torch", "torchvision", "fvcore", "trainers", "profilers"}


STRATEGY_FILES = [p for p in sources("trainers/strategies") if p.name != "__init__.py"]


@pytest.mark.parametrize("path", STRATEGY_FILES, ids=lambda p: p.name)
def test_strategies_import_only_the_strategy_api(path):
    """Engine v2: an algorithm sees the roles only through trainers.api (no engine, role or
    runtime internals, no other project package); torch, numpy and the standard library are free."""
    project = {"adaptplan", "profilers", "solvers", "trainers"}
    used = {name for name in imported_modules(path) if name.split(".")[0] in project}
    assert used == {"trainers.api"}, used


def test_roles_do_not_import_the_runtime_or_strategies():
    """The role code is shared by every runtime: it never imports the simulator, the driver or an algorithm."""
    used = imported_modules(ROOT / "trainers" / "roles.py") | imported_modules(ROOT / "trainers" / "messages.py")
    assert not {n for n in used if n.startswith(("trainers.engine", "trainers.run", "trainers.strategies"))}
