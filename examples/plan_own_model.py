"""Plan split training for your own ``nn.Module`` (docs/api.md): profile it, estimate its training constants on a
few mini-batches, generate (or load) the devices' system, and ask the planner where each device should cut and how
often to average. Run:  python examples/plan_own_model.py --devices 10
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from adaptplan import Planner, build_chain, estimate_constants, generate_system, profile_model


class SmallNet(nn.Module):
    """Any model made of layers fx can trace; here a 3-block CNN for 3×32×32 images."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.conv2 = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 8 * 8, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv2(self.conv1(x)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=10, help="number of devices")
    parser.add_argument("--lr", type=float, default=0.01, help="the learning rate γ you will train with")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = SmallNet()
    profile = profile_model(model, (3, 32, 32), model_name="SmallNet")       # cut points, FLOPs, sizes per cut
    print(f"{profile.num_cuts} cut points: {', '.join(c.name for c in profile.cut_points)}")
    batches = [(torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))) for _ in range(8)]   # your data here
    chain = build_chain(model, batches[0][0])
    constants = estimate_constants(chain, batches, gamma=args.lr, epsilon=0.5)   # β, σ², G², ϑ of this model
    system = generate_system(args.devices, seed=0)                           # or SystemSpec.load("system.json")
    plan = Planner(profile, system, constants).plan()
    print(f"plan: cuts {plan.cuts}, interval I = {plan.interval}, {plan.rounds} rounds, "
          f"{plan.total_latency_s:.0f} simulated seconds (gap {plan.gap:.2%})")


if __name__ == "__main__":
    main()
