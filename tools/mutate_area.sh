#!/usr/bin/env bash
# One mutation pass over one area of the project, with the test files that exercise it (docs/mutation.md).
#
#   tools/mutate_area.sh AREA [tools/mutate.py options...]
#   tools/mutate_area.sh solvers --sample 40 --seed 7 --json /tmp/solvers.json
#
# AREA: solvers | profilers | planner (adaptplan's planner side) | cli-training (adaptplan's train/plot/profile/
# bench commands and benchmark harnesses) | trainers-core | trainers-run | distributed.
# Runs at low priority with one torch thread per process; PYTHON overrides the interpreter (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
area=${1:-}
[ -n "$area" ] && shift || true

case "$area" in
  solvers)
    targets="solvers"
    tests="tests/solvers/test_interval.py tests/adaptplan/test_convergence.py tests/solvers/test_milfp.py \
tests/solvers/test_reference_objective.py tests/test_planner_contracts.py tests/adaptplan/test_spec_worked_example.py \
tests/solvers/test_dinkelbach.py tests/solvers/test_baselines.py tests/solvers/test_threshold.py tests/solvers/test_threshold_bounds.py \
tests/solvers/test_bcd.py tests/solvers/test_certificate.py tests/solvers/test_solver_edges.py tests/solvers/test_memory_budget.py \
tests/solvers/test_instances.py tests/solvers/test_backends.py -k 'not 200_instances'" ;;
  profilers)
    targets="profilers"
    tests="tests/test_profiler_contracts.py tests/test_profiler_fresh.py tests/profilers/test_profile.py tests/profilers/test_cutpoints.py \
tests/profilers/test_gradstats.py tests/profilers/test_flops.py tests/adaptplan/test_scenarios.py" ;;
  planner)
    targets="adaptplan/cli/__init__.py adaptplan/cli/commands/plan.py adaptplan/cli/commands/system.py adaptplan/constants.py \
adaptplan/convergence.py adaptplan/errors.py adaptplan/fileio.py adaptplan/latency.py adaptplan/lazy.py \
adaptplan/model_profile.py adaptplan/plan.py adaptplan/planner.py adaptplan/report.py adaptplan/scenarios.py \
adaptplan/system.py"
    tests="tests/adaptplan/test_convergence.py tests/test_input_contracts.py tests/adaptplan/test_latency.py \
tests/adaptplan/test_system.py tests/adaptplan/test_spec_worked_example.py tests/test_planner_contracts.py \
tests/test_planner_fresh.py tests/adaptplan/cli/test_cli_content.py tests/adaptplan/test_world_model.py tests/solvers/test_reference_objective.py \
tests/solvers/test_milfp.py tests/adaptplan/cli/test_cli_plan.py tests/test_cli_misc.py tests/adaptplan/test_hostile_inputs.py \
tests/adaptplan/test_scenarios.py tests/solvers/test_memory_budget.py" ;;
  cli-training)
    targets="adaptplan/benches/algorithms.py adaptplan/benches/engine.py adaptplan/benches/runs.py adaptplan/benches/solvers.py \
adaptplan/benches/training.py adaptplan/cli/commands/train.py adaptplan/cli/commands/plot.py adaptplan/cli/commands/profile.py \
adaptplan/cli/commands/bench.py adaptplan/cli/flags.py adaptplan/limits.py adaptplan/plannable.py"
    tests="tests/test_cli_contracts.py tests/test_bench_contracts.py tests/adaptplan/benches/test_bench_tables.py \
tests/adaptplan/benches/test_bench_algorithms.py tests/adaptplan/benches/test_bench_training.py tests/adaptplan/test_hostile_inputs.py tests/adaptplan/cli/test_train_cli.py \
tests/adaptplan/cli/test_profile_cli.py -k 'not done_when_20_device and not mnist_above_chance'" ;;
  trainers-core)
    targets="trainers/api.py trainers/roles/batching.py trainers/engine/clock.py trainers/config/devices.py trainers/engine/split_engine.py \
trainers/roles/messages.py trainers/inputs/models.py trainers/roles/optim.py trainers/inputs/partition.py trainers/run/policies.py trainers/roles/core.py \
trainers/strategies"
    tests="tests/test_engine_contracts.py tests/test_strategy_contracts.py tests/test_core_units.py tests/trainers/engine/test_engine.py \
tests/trainers/engine/test_engine_timing.py tests/trainers/strategies/test_strategies.py tests/trainers/strategies/test_cyclesl.py tests/trainers/strategies/test_gapsl.py tests/trainers/strategies/test_gas.py \
tests/trainers/strategies/test_scala.py tests/trainers/run/test_policies.py tests/trainers/inputs/test_partition.py tests/trainers/roles/test_batching.py tests/trainers/config/test_train_config.py \
tests/project/test_architecture.py tests/adaptplan/test_scenarios.py" ;;
  trainers-run)
    targets="trainers/run/driver.py trainers/config/train_config.py trainers/run/checkpoint.py trainers/inputs/datasets.py trainers/run/history.py \
trainers/run/folder.py trainers/run/plotting.py"
    tests="tests/test_run_contracts.py tests/test_cli_contracts.py tests/adaptplan/cli/test_train_cli.py tests/trainers/config/test_train_config.py \
tests/trainers/run/test_run_safety.py tests/trainers/run/test_history.py tests/trainers/inputs/test_datasets.py" ;;
  distributed)
    targets="trainers/distributed adaptplan/distributed.py"
    tests="tests/test_distributed_contracts.py tests/test_distributed_units.py \
tests/trainers/distributed/test_distributed.py::test_every_algorithm_runs_distributed_with_the_simulations_losses[sfl-v1] \
tests/trainers/distributed/test_distributed.py::test_every_algorithm_runs_distributed_with_the_simulations_losses[sl] \
tests/trainers/distributed/test_distributed.py::test_repartition_under_a_random_policy_moves_blocks_between_ranks \
tests/trainers/distributed/test_distributed.py::test_emulated_links_deliver_at_the_latency_models_time" ;;
  *)
    echo "usage: tools/mutate_area.sh solvers|profilers|planner|cli-training|trainers-core|trainers-run|distributed" \
         "[tools/mutate.py options]" >&2
    exit 2 ;;
esac

# shellcheck disable=SC2086  # targets are space-separated paths on purpose
exec env OMP_NUM_THREADS=1 nice -n 10 "$PYTHON" tools/mutate.py $targets --tests "$tests" "$@"
