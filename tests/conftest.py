"""Test-session settings: one torch thread (small models on 2 shared cores run fastest that way)."""

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_configure(config):
    try:
        import torch
    except ImportError:  # the planner's tests do not need torch
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def example():
    """docs/model.md §7's worked example as a PlanningProblem (tests/worked_example.py)."""
    from tests.worked_example import worked_example_problem

    return worked_example_problem()


@pytest.fixture
def vgg16():
    """VGG-16 on CIFAR-10 with 20 devices of the §6.1 placeholder system (tests/solver_instances.py:
    ``vgg16_problem``, which other sizes call directly). A fresh problem per test: tests may rescale its matrices."""
    from tests.solver_instances import vgg16_problem

    return vgg16_problem()


# ---- the quick tier: pytest -m "not slow" (issue 37 item 6) ----------------------------------------------------
SLOW_FILES = (
    "tests/trainers/distributed/test_distributed.py",      # real ranks over gloo: 5-50 s each
    "tests/trainers/distributed/test_mqtt.py",             # real ranks through a real broker
    "tests/trainers/distributed/test_provision.py",        # certificates, a broker, a whole deployment
    "tests/trainers/distributed/test_lying_device.py",     # real ranks, one of them lying: ~8 s each
)
"""Test files whose every test is slow (they start processes, brokers or whole runs)."""
SLOW_TESTS = (
    "tests/trainers/run/test_mlflow_tracking.py::test_a_real_tracking_server_gets_the_same_run",   # mlflow server: ~10 s
    "tests/trainers/run/test_mlflow_tracking.py::test_a_resumed_run_logs_on_into_its_mlflow_run",
    "tests/project/test_readme_using_it.py::test_using_it_commands_run_in_order_from_an_empty_folder",
    "tests/solvers/test_bcd.py::test_bcd_within_0_1_percent_of_joint_optimum_on_200_instances",
    "tests/solvers/test_bcd.py::test_bcd_vgg16_default_scenario_matches_exact",
    "tests/project/test_device_check.py::",
    "tests/project/test_paper_scale_bench.py::",
    "tests/project/test_new_algorithm.py::",                # a copy of the repository, a toy algorithm: ~20 s
    "tests/project/test_examples.py::",
    "tests/project/test_engine_ab.py::test_head_against_the_working_tree_in_lock_step",
    "tests/trainers/run/test_run_folder.py::test_resuming_imports_only_a_user_model_named_on_the_command_line",
    "tests/trainers/run/test_run_folder.py::test_a_model_name_that_ends_the_process_is_refused_with_one_line",
    "tests/trainers/run/test_checkpoint.py::test_every_edited_checkpoint_is_refused_with_one_line",
    "tests/trainers/run/test_full_disk.py::",
    "tests/trainers/run/test_run_safety.py::",
    "tests/adaptplan/cli/test_profile_cli.py::",
    "tests/adaptplan/cli/test_train_cli.py::test_done_when_20_device_adaptsfl_on_cifar10_subset_plots_and_resumes_identically",
    "tests/adaptplan/cli/test_fuzz_cli.py::",
    "tests/adaptplan/cli/test_cli.py::test_channels_last_input_is_one_line_with_the_fix",
    "tests/adaptplan/cli/test_cli.py::test_own_model_from_the_working_directory_without_pythonpath",
    "tests/adaptplan/benches/test_bench_papers.py::",
    "tests/adaptplan/benches/test_bench_training.py::",
    "tests/adaptplan/benches/test_bench_algorithms.py::",
    "tests/adaptplan/benches/test_bench_plans.py::test_bench_plans_end_to_end_table_json_and_heat_map_agree",   # ~6 s
    "tests/profilers/test_small_image_models.py::test_profile_cli_refuses_a_vit_size_with_exit_2_and_no_traceback",
)
"""Single tests, or files (a prefix ending in ``::``), of more than a few seconds each (measured with
``--durations``); the quick tier leaves them out, CI runs everything."""


PROCESS_GROUP = "processes"
"""The pytest-xdist group (``--dist loadgroup``, pyproject.toml's addopts) of :data:`SLOW_FILES`' tests: one worker runs
them one after another, as a serial run would, so that two of them never share the cores with their ranks (several
of them time ranks out or time emulated links); the other worker runs the rest beside them."""


def pytest_collection_modifyitems(config, items):
    """Mark the slow tests (``slow``) and put the multi-process ones in one xdist group (:data:`PROCESS_GROUP`); a
    listed test that no longer exists is an error, so the list cannot rot."""
    matched = set()
    for item in items:
        node = item.nodeid
        files = [f for f in SLOW_FILES if node.startswith(f + "::")]
        hits = [p for p in SLOW_TESTS if node.startswith(p)] + files
        if hits:
            item.add_marker(pytest.mark.slow)
            matched.update(hits)
        if files:
            item.add_marker(pytest.mark.xdist_group(PROCESS_GROUP))
    modules = {item.nodeid.split("::", 1)[0]: getattr(item, "module", None) for item in items}
    stale = [p for p in (*SLOW_TESTS, *SLOW_FILES) if p.split("::", 1)[0] in modules and p not in matched
             and not _defined(p, modules[p.split("::", 1)[0]])]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py lists slow tests that do not exist: {stale}")


def _defined(entry: str, module: object) -> bool:
    """Whether the slow-test ``entry`` (``path::name``, a prefix of node ids) names a test of its file's ``module``,
    selected or not (a run of one other test of the file must not call it stale); without the module (never
    imported), whether ``entry`` is a file."""
    name = entry.partition("::")[2].split("[", 1)[0]
    if not name:
        return True
    return module is not None and any(attr.startswith(name) for attr in vars(module))
