"""The planner per cut (docs/model.md §12 "Per cut") scored on a `bench plans` grid whose run folders are gone.

    python benchmarks/per_cut_from_results.py RESULTS_JSON [bench plans flags of that grid] [--rule one-kappa]

reads the grid's results (benchmarks/results/plans/*/results.json), takes the planner per cut's pilots from it as
`bench plans` does (every cut at I = 1 and the cut fastest there at the largest interval that reached the target, per
seed), fits the law, plans on the seed's round-1 system and reads the plan's time to the target from the grid when
the grid trained that plan, else trains it (the bench's setting and seed, in a temporary folder). It prints each
seed's plan, its predicted and measured seconds, and the mean against the grid's best fixed plan, as the bench's
row would. ``--rule one-kappa`` scores the first rule instead (one κ from the fastest cut's pair, extrapolated to
every cut: benchmarks/results/plans/README.md), transcribed below as it was fixed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from adaptplan.benches import plans as bench
from adaptplan.benches.runs import run_one
from adaptplan.benches.training import ADAPTSFL_SETTING
from adaptplan.calibration import PilotRun
from adaptplan.cli import build_parser
from adaptplan.cli.commands.bench import setting_from, workload_from
from adaptplan.defence_cost import DefenceSetting
from adaptplan.linear_rounds import LinearRounds, as_plan, fit_per_cut_rounds


def one_kappa_law(pilots: list[PilotRun]) -> Any:
    """The first rule: R₁ per cut at I = 1, one κ from the longer pilots, R(x, I) = max R₁(x_i)(1 + κ(I − 1)) at every
    cut up to the longest pilot interval (a law per cut whose every cut carries the same κ and that range)."""
    at_one = {p.deepest_cut: p.rounds for p in pilots if p.interval == 1}
    longer = [p for p in pilots if p.interval > 1]
    kappa = max(0.0, statistics.fmean((p.rounds / at_one[p.deepest_cut] - 1) / (p.interval - 1) for p in longer))
    top = max(p.interval for p in pilots)
    law = fit_per_cut_rounds(pilots)
    laws = {j: LinearRounds(r, kappa, pilots[0].target_accuracy, tuple(pilots), "") for j, r in at_one.items()}
    return type(law)(laws, {j: (1, top) for j in at_one}, law.target_accuracy, law.pilots, "one κ")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--rule", choices=("per-cut", "one-kappa"), default="per-cut")
    ours, rest = parser.parse_known_args(argv)
    data = json.loads(Path(ours.results).read_text())
    args = build_parser().parse_args(["bench", "plans", *rest])
    args.defence = DefenceSetting.parse(args.defence, "--defence").name
    setup = workload_from(args, setting_from(args, ADAPTSFL_SETTING), bench.BenchSetting)
    plans = {p["label"]: p for p in data["plans"]}
    intervals = data["intervals"]
    fixed = [p for p in data["plans"] if p["kind"] in ("uniform", "latency-best") and p["mean_time_to_target_s"]]
    best = min(fixed, key=lambda p: p["mean_time_to_target_s"])
    times: list[float | None] = []
    for seed in data["seeds"]:
        run = {label: next(r for r in p["runs"] if r["seed"] == seed) for label, p in plans.items()
               if p["kind"] in ("uniform", "latency-best")}
        probe = bench.probe(setup, seed, intervals)
        cuts = probe.cuts
        seconds = {label: r["time_to_target_s"] for label, r in run.items() if r["time_to_target_s"] is not None}
        labels, why = bench.per_cut_pilot_labels(seconds, cuts, intervals, setup.target)
        if why is not None:
            print(f"seed {seed}: no plan: {why}")
            times.append(None)
            continue
        pilots = [PilotRun(label, plans[label]["interval"], plans[label]["cuts_by_seed"][str(seed)][0], setup.target,
                           run[label]["rounds_to_target"]) for label in labels]
        law = fit_per_cut_rounds(pilots) if ours.rule == "per-cut" else one_kappa_law(pilots)
        chosen = as_plan(law.plan(probe.profile, probe.system, candidates=bench.law_candidates(setup, probe)), law,
                         probe.profile, probe.system)
        key = (list(chosen.cuts), chosen.interval)
        grid = next((label for label, p in plans.items() if p["kind"] in ("uniform", "latency-best")
                     and (p["cuts_by_seed"][str(seed)], p["interval"]) == key), None)
        if grid is not None:
            measured, where = run[grid]["time_to_target_s"], f"the grid's {grid!r}"
        else:
            with tempfile.TemporaryDirectory() as folder:
                config = {**setup.run_config(seed), "cuts": list(chosen.cuts), "interval": chosen.interval}
                measured = run_one({"group": "plans", "config": config, "target": setup.target, "label": "per cut", "seed": seed,
                                    "folder": folder}).time_to_target_s
            where = "trained here"
        times.append(measured)
        shown = bench.show_cuts(list(chosen.cuts))
        print(f"seed {seed}: cuts {shown}, I = {chosen.interval}: predicted {chosen.rounds} rounds, "
              f"{chosen.total_latency_s:.3g} s; measured {measured if measured is None else f'{measured:.3g}'} s "
              f"({where})")
    if all(t is not None for t in times):
        mean = statistics.fmean(t for t in times if t is not None)
        print(f"mean {mean:.3g} s: {mean / best['mean_time_to_target_s']:.2f} × the best fixed plan "
              f"({best['label']}: {best['mean_time_to_target_s']:.3g} s)")
    else:
        print("a seed's plan did not reach the target")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
