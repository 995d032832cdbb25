"""Re-planning inside a training loop (Algorithm 1 of docs/model.md §5.4), with the planner API only.

Resources drift every round (device FLOP/s and uplinks re-drawn, as in the AdaptSFL experiments,
with 10% measurement noise); every Q rounds — at an aggregation boundary — the planner is called
again with the latest measurement, warm-started from the plan in force. The loop here charges
each round the latency model's seconds for the *true* state; your training step goes where the
comment says. Run:  python examples/replan_in_loop.py --rounds 200
"""

from __future__ import annotations

import argparse

from adaptplan import LatencyModel, Planner, SystemProcess
from adaptplan.scenarios import default_scenario


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="training rounds to simulate")
    parser.add_argument("--devices", type=int, default=20, help="number of devices")
    parser.add_argument("--noise-cv", type=float, default=0.1, help="measurement noise (coefficient of variation)")
    args = parser.parse_args(argv)

    scenario = default_scenario(devices=args.devices)
    process = SystemProcess(scenario.system, seed=1, redraw=True, noise_cv=args.noise_cv)
    planner = Planner(scenario.profile, process.measured(1), scenario.constants)
    plan = planner.plan()
    print(f"round 1: cuts {sorted(set(plan.cuts))}, I = {plan.interval}")
    simulated_s, last_replan = 0.0, 0
    for t in range(1, args.rounds + 1):
        # ... one split-training round with plan.cuts goes here ...
        latency = LatencyModel(scenario.profile, process.state(t))
        simulated_s += latency.t_split(plan.cuts)
        if t - last_replan == plan.interval:  # aggregation boundary (t0 mod I = 0), Q = I
            simulated_s += latency.t_agg(plan.cuts)
            # ... client-side model aggregation (eq. 7) goes here ...
            new_plan = planner.replan(system=process.measured(t), warm_start=plan)
            if (new_plan.cuts, new_plan.interval) != (plan.cuts, plan.interval):
                print(f"round {t}: re-planned -> cuts {sorted(set(new_plan.cuts))}, I = {new_plan.interval}")
            plan, last_replan = new_plan, t
    print(f"{args.rounds} rounds take {simulated_s:.1f} simulated seconds; final plan predicts "
          f"{plan.rounds} rounds, {plan.total_latency_s:.0f} s in total")


if __name__ == "__main__":
    main()
