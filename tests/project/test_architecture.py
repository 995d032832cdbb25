"""docs/architecture.md's layering rules, checked on the source: solvers never import torch; solvers and
profilers never import trainers; nothing imports the CLI; adaptplan's world model is torch-free."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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
                                  if "cli" not in p.relative_to(ROOT).parts[1:-1]], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_nothing_imports_the_cli(path):
    """The parser and its error handling (adaptplan/cli/__init__.py) are imported by their package only."""
    assert "adaptplan.cli" not in imported_modules(path)


WORLD_MODEL = ["__init__.py", "calibration.py", "constants.py", "convergence.py", "crossing.py", "errors.py",
               "fileio.py", "latency.py", "lazy.py", "model_profile.py", "plan.py", "prediction.py", "report.py",
               "scenarios.py", "system.py"]


@pytest.mark.parametrize("name", WORLD_MODEL)
def test_world_model_is_torch_free(name):
    assert not roots(imported_modules(ROOT / "adaptplan" / name)) & {"torch", "torchvision", "fvcore", "trainers", "profilers"}


def test_the_planner_loads_torch_only_in_its_estimation_step():
    """adaptplan/planner.py (layer 2, above profilers) imports profilers only inside ``Planner.estimate``, the one
    call that measures a torch model: planning, predicting and comparing never load torch (``adaptplan plan`` is
    checked at run time in tests/adaptplan/cli/test_cli_plan.py)."""
    path = ROOT / "adaptplan" / "planner.py"
    torch_side = {"torch", "torchvision", "fvcore", "trainers", "profilers"}
    assert not roots(imported_modules(path, top_level_only=True)) & torch_side
    tree = ast.parse(path.read_text(encoding="utf-8"))
    importing = sorted(f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                       and any(isinstance(n, (ast.Import, ast.ImportFrom)) and n.level == 0
                               and roots({n.module if isinstance(n, ast.ImportFrom) else n.names[0].name}) & torch_side
                               for n in ast.walk(f)))
    assert importing == ["estimate"]


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
    used = set().union(*(imported_modules(path) for path in sources("trainers/roles")))
    assert any(n.startswith("trainers.roles.") for n in used)           # the folder was read
    assert not {n for n in used if n.startswith(("trainers.engine", "trainers.run", "trainers.distributed",
                                                 "trainers.strategies", "trainers.api"))}


# ---- one direction of dependency (docs/architecture.md "Package map") ------------------------------------
PACKAGES = ("adaptplan", "profilers", "solvers", "trainers")
LAYERS: tuple[tuple[str, ...], ...] = (
    ("adaptplan",),                                   # 0 the world model: adaptplan/ but what is named below
    ("solvers", "profilers"),                         # 1
    ("adaptplan/planner.py", "adaptplan/linear_rounds.py"),   # 2 the planners
    ("trainers",),                                    # 3
    ("adaptplan/cli", "adaptplan/benches", "adaptplan/distributed.py"),   # 4 the roof
)
"""The layers, lowest first, each a list of folders and files: a module is in the layer of the longest folder or
file that holds it. The roof — the command line, the benchmarks with the comparisons' settings and recipes, the
ranks' entry point — may import anything, and nothing below imports it."""
TRAINER_LAYERS = ("trainers/algorithms.py", "trainers/config", "trainers/inputs", "trainers/roles", "trainers/api.py",
                  "trainers/strategies", "trainers/engine", "trainers/distributed", "trainers/run")
"""trainers/ by sub-layer, lowest first (docs/architecture.md "Package map"): the algorithm registry, what a run
is, what it trains on, the roles and their messages, the strategy API, the strategies, the engine, the
distributed runtimes, the run driver and its files. A module imports only its own sub-layer or lower ones."""


def _holds(entry: str, module: str) -> bool:
    where = module.replace(".", "/")
    return where == entry.removesuffix(".py") or where.startswith(entry.removesuffix(".py") + "/")


def layer(module: str) -> int:
    """0 world model, 1 solvers and profilers, 2 the planner, 3 trainers, 4 the roof (:data:`LAYERS`)."""
    found = [(len(entry), i) for i, entries in enumerate(LAYERS) for entry in entries if _holds(entry, module)]
    return max(found)[1] if found else 0


def trainer_layer(module: str) -> int | None:
    """The index in :data:`TRAINER_LAYERS` of the folder or file holding ``module`` (None: ``trainers`` itself)."""
    found = [i for i, entry in enumerate(TRAINER_LAYERS) if _holds(entry, module)]
    return found[0] if found else None


def module_name(path: Path, root: Path) -> str:
    name = ".".join(path.relative_to(root).with_suffix("").parts)
    return name.removesuffix(".__init__")


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES):
    """Module → project modules it imports, lazy imports inside functions included
    (``from pkg import name`` counts as importing ``pkg.name`` when that is a module)."""
    import networkx as nx

    modules = {module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = nx.DiGraph()
    for module, path in modules.items():
        graph.add_node(module)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in filter(None, map(resolve, targets)):
                if target != module:
                    graph.add_edge(module, target)
    return graph


def violations(graph) -> list[str]:
    """Every import cycle and every edge to a higher layer, or sideways to another package of the
    same layer (solvers ↔ profilers), or to a higher sub-layer of trainers/, in words."""
    import networkx as nx

    found = [f"import cycle: {' -> '.join(sorted(c))}" for c in nx.strongly_connected_components(graph) if len(c) > 1]
    for a, b in sorted(graph.edges):
        if layer(b) > layer(a) or (layer(b) == layer(a) == 1 and a.split(".")[0] != b.split(".")[0]):
            found.append(f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})")
        elif layer(a) == layer(b) == 3 and None not in (trainer_layer(a), trainer_layer(b)) \
                and trainer_layer(b) > trainer_layer(a):
            found.append(f"{a} ({TRAINER_LAYERS[trainer_layer(a)]}) imports {b} ({TRAINER_LAYERS[trainer_layer(b)]})")
    return found


def test_the_packages_import_in_one_direction_without_cycles():
    graph = import_graph()
    assert graph.number_of_edges() > 200            # the whole code base was read, lazy imports included
    assert ("trainers.config.train_config", "profilers.models") in graph.edges      # a lazy import inside a function
    assert violations(graph) == []


def test_an_injected_cycle_or_upward_import_is_caught(tmp_path):
    graph = import_graph()
    graph.add_edge("trainers.config.train_config", "trainers.run.driver")                  # run imports config
    graph.add_edge("adaptplan.system", "trainers.engine.split_engine")              # the world model importing the engine
    graph.add_edge("solvers.milfp", "profilers.flops")                 # sideways between layer-1 packages
    graph.add_edge("trainers.roles.core", "trainers.engine.clock")     # a role reaching up into the engine
    found = violations(graph)
    assert any(v.startswith("import cycle:") and "trainers.config.train_config" in v and "trainers.run.driver" in v for v in found), found
    assert "adaptplan.system (layer 0) imports trainers.engine.split_engine (layer 3)" in found
    assert "solvers.milfp (layer 1) imports profilers.flops (layer 1)" in found
    assert "trainers.roles.core (trainers/roles) imports trainers.engine.clock (trainers/engine)" in found
    # and from source: a lazy import inside a function closes a cycle between two files
    pkg = tmp_path / "trainers"
    pkg.mkdir()
    (pkg / "a.py").write_text("import trainers.b\n")
    (pkg / "b.py").write_text("def f():\n    from trainers.a import g\n")
    assert violations(import_graph(tmp_path, ("trainers",))) == ["import cycle: trainers.a -> trainers.b"]


def test_every_trainers_module_sits_in_a_sub_layer_folder() -> None:
    """No flat module beside the sub-layers: every file of trainers/ is in a folder or file of TRAINER_LAYERS, and
    the roof and the planner are where LAYERS says."""
    graph = import_graph()
    loose = sorted(m for m in graph if m.startswith("trainers.") and trainer_layer(m) is None)
    assert loose == []
    assert [layer(m) for m in ("adaptplan.cli.commands.train", "adaptplan.benches.papers", "adaptplan.planner",
                               "adaptplan.latency", "solvers.milfp", "trainers.engine.clock")] == [4, 4, 2, 0, 1, 3]


def test_the_algorithm_registry_is_torch_free_and_reaches_strategies_only_by_name():
    """trainers/algorithms.py (what the CLI, the configuration and the benches read) imports neither torch nor a
    strategy: each entry names its strategy as ``module:Class``, imported when a run makes one."""
    used = imported_modules(ROOT / "trainers" / "algorithms.py")
    assert not roots(used) & {"torch", "torchvision", "numpy", "fvcore", "profilers", "solvers"}
    assert {n for n in used if n.startswith("trainers")} == set()


LONG_FUNCTIONS: set[tuple[str, str]] = set()
"""The functions of trainers/ over 60 lines: none (issue 35 item 1)."""


def test_no_function_in_trainers_grows_over_sixty_lines():
    """A ratchet: no function of trainers/ is over 60 lines but the listed ones, and each listed one still is
    (a split one leaves the list)."""
    found = set()
    for path in sources("trainers"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for owner in [tree, *[n for n in tree.body if isinstance(n, ast.ClassDef)]]:
            for node in owner.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
                    name = node.name if owner is tree else f"{owner.name}.{node.name}"
                    found.add((path.relative_to(ROOT).as_posix(), name))
    assert found == LONG_FUNCTIONS


LONG_CLASSES: set[tuple[str, str]] = set()
"""The classes of trainers/ over 300 lines (issue 68 item 4): none. The Trainer was split (its plan is
trainers/run/run_planning.py, its resume checks resume_check.py, its files output.py), and so was the EdgeServer
(the role in roles/core.py, the passes that stream within the memory budget in roles/passes.py)."""


def test_no_class_in_trainers_grows_over_three_hundred_lines():
    """A ratchet: no class of trainers/ is over 300 lines but the listed ones, and each listed one still is."""
    found = set()
    for path in sources("trainers"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 300:
                found.add((path.relative_to(ROOT).as_posix(), node.name))
    assert found == LONG_CLASSES


def test_no_function_in_the_project_is_over_eighty_lines():
    """Issue 68 item 3: no function or method of the project (the four packages, tools, benchmarks, examples and the
    tests) is over 80 lines, docstring included (trainers/ keeps its 60, above)."""
    found = set()
    for package in ("adaptplan", "profilers", "solvers", "trainers", "tools", "benchmarks", "examples", "tests"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80:
                    found.add((path.relative_to(ROOT).as_posix(), node.name, node.end_lineno - node.lineno + 1))
    assert not found, sorted(found)


def test_the_simulation_engine_is_a_facade_under_300_lines():
    """Issue 35 item 1: SplitEngine delegates its parts (trainers.engine.sync_round, async_loop, aggregation, repartition,
    model_views, engine_state): the class itself, docstring included, stays under 300 lines."""
    tree = ast.parse((ROOT / "trainers" / "engine" / "split_engine.py").read_text(encoding="utf-8"))
    (engine,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SplitEngine"]
    assert engine.end_lineno - engine.lineno + 1 < 300


ENGINE_PARTS = ("sync_round", "async_loop", "aggregation", "repartition", "model_views", "state")


def _engine_reads(tree: ast.AST) -> set[str]:
    """The attributes read or written on ``engine`` or ``self.engine`` in ``tree``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "engine") or (
                    isinstance(owner, ast.Attribute) and owner.attr == "engine" and isinstance(owner.value, ast.Name)
                    and owner.value.id == "self"):
                names.add(node.attr)
    return names


def test_the_engine_parts_see_the_engine_only_through_its_declared_seam() -> None:
    """Issue 68 item 1: each part of the engine annotates the engine as trainers.engine.seams.EngineParts (never Any)
    and uses only what that Protocol declares, none of it private; the facade declares each of them."""
    seam = ast.parse((ROOT / "trainers" / "engine" / "seams.py").read_text(encoding="utf-8"))
    (protocol,) = [n for n in seam.body if isinstance(n, ast.ClassDef) and n.name == "EngineParts"]
    declared = {n.target.id for n in protocol.body if isinstance(n, ast.AnnAssign)} | \
        {n.name for n in protocol.body if isinstance(n, ast.FunctionDef)}
    assert not {name for name in declared if name.startswith("_")}
    for part in ENGINE_PARTS:
        source = (ROOT / "trainers" / "engine" / f"{part}.py").read_text(encoding="utf-8")
        assert "Engine = Any" not in source and "Engine = EngineParts" in source, part
        used = _engine_reads(ast.parse(source))
        assert used and used <= declared, (part, used - declared)
    facade = ast.parse((ROOT / "trainers" / "engine" / "split_engine.py").read_text(encoding="utf-8"))
    (engine,) = [n for n in facade.body if isinstance(n, ast.ClassDef) and n.name == "SplitEngine"]
    has = {n.name for n in engine.body if isinstance(n, ast.FunctionDef)} | {
        t.attr for n in ast.walk(engine) if isinstance(n, (ast.Assign, ast.AnnAssign))
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        for t in ([*t.elts] if isinstance(t, ast.Tuple) else [t])
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    assert declared <= has, declared - has


def test_no_test_module_imports_another() -> None:
    """Shared builders live in helper modules (tests/*.py without the test_ prefix) or conftest fixtures: a test
    module imported by another would run its tests' module-level set-up there and tie the two together."""
    tests = sorted((ROOT / "tests").rglob("test_*.py"))
    assert len(tests) > 80                                              # every folder was read
    offenders = {path.name: sorted(n for n in imported_modules(path)
                                   if n.startswith("tests.") and n.rpartition(".")[2].startswith("test_"))
                 for path in tests}
    assert not {k: v for k, v in offenders.items() if v}


def test_the_tests_mirror_the_packages() -> None:
    """Issue 35 item 5: tests/<package>/... holds the tests of that folder of the code (tests/project/ those of the
    repository as a whole: layering, docs, README, examples, tools); every test folder names a code folder."""
    folders = {p.parent.relative_to(ROOT / "tests").as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    assert "." not in folders                                           # no test left at the top
    assert {f for f in folders if f != "project" and not (ROOT / f).is_dir()} == set()
    assert {"solvers", "profilers", "adaptplan/cli", "trainers/engine", "trainers/strategies"} <= folders


EXECUTION_WORDS = ("chunk", "span", "replay", "reply_now", "on_reply", "early", "recompute")
"""How a round is executed (passes of bounded size, row slices, replayed passes, replies before the barrier is
done, recomputed forwards): the runtime's business, never a name of the strategy API (issue 35 item 2)."""


def test_the_strategy_api_names_no_execution_detail() -> None:
    import dataclasses

    from trainers import api

    exposed = set(api.__all__) | {f.name for f in dataclasses.fields(api.RoundContext)}
    for cls in (api.ServerPasses, api.ModelViews, api.RoundContext, api.Strategy, api.AsyncStrategy, api.ParallelStep):
        exposed |= {name for name in vars(cls) if not name.startswith("_")}
    assert "in_passes" in exposed and "pooled_pass" in exposed         # what a strategy may ask instead
    assert sorted(n for n in exposed if any(w in n.lower() for w in EXECUTION_WORDS)) == []
    for path in STRATEGY_FILES:                                         # and no strategy reaches past the API for them
        words = {node.attr for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(node, ast.Attribute)}
        assert sorted(w for w in words if any(x in w.lower() for x in EXECUTION_WORDS)) == [], path.name
