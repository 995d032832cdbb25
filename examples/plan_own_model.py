"""Plan split training for your own ``nn.Module`` and train with the plan (docs/api.md): profile the model,
estimate its training constants on real mini-batches of the data set, generate (or load) the devices' system, ask
the planner where each device should cut and how often to average, and hand that plan to ``train``.
Run:  python examples/plan_own_model.py --devices 10 --rounds 20
"""

from __future__ import annotations

import argparse

import torch
from mymodels import SmallNet  # examples/mymodels.py: importable because it sits beside this script

from adaptplan import Planner, TrainConfig, build_chain, estimate_constants, generate_system, profile_model, train, training_batches

DATASET = "cifar10-subset"             # SmallNet's input: 3x32x32 images, 10 classes
MODEL = "mymodels:SmallNet"            # how a run names your model: module:factory (docs/api.md "The model factory")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=10, help="number of devices")
    parser.add_argument("--lr", type=float, default=0.01, help="the learning rate γ you will train with")
    parser.add_argument("--rounds", type=int, default=20, help="training rounds with the plan (0: plan only)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = SmallNet(num_classes=10)
    profile = profile_model(model, (3, 32, 32), model_name=MODEL)          # cut points, FLOPs, sizes per cut
    print(f"{profile.num_cuts} cut points: {', '.join(c.name for c in profile.cut_points)}")
    batches = training_batches(DATASET, batch_size=16, num_batches=8, seed=0)   # real (x, y) of the data set
    chain = build_chain(model, batches[0][0])
    constants = estimate_constants(chain, batches, gamma=args.lr, epsilon=0.5)   # β, σ², G², ϑ of this model
    system = generate_system(args.devices, seed=0)                           # or SystemSpec.load("system.json")
    plan = Planner(profile, system, constants).plan()
    print(f"plan: cuts {plan.cuts}, interval I = {plan.interval}, {plan.rounds} rounds, "
          f"{plan.total_latency_s:.0f} simulated seconds (gap {plan.gap:.2%})")
    if args.rounds:
        config = TrainConfig.flat(algorithm="adaptsfl", dataset=DATASET, model=MODEL, plan=plan, lr=args.lr,
                                  rounds=args.rounds, eval_every=args.rounds, system_seed=0, progress=False)
        history = train(config)
        print(f"trained {args.rounds} rounds with the plan: accuracy {history.final_accuracy:.3f}, "
              f"{history.records[-1].sim_seconds:.2f} simulated seconds")


if __name__ == "__main__":
    main()
