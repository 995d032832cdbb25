"""Plan, train and check the plan inside your own training loop, with the Planner API only (docs/api.md "Plan, train
and check in your own loop"): estimate the constants on your model and data, calibrate them on two short pilot runs
of your loop, plan, predict the rounds and simulated seconds to your target accuracy, train with the plan, and
compare what your run measured with what was predicted.
Run:  python examples/plan_in_own_loop.py --target 0.7 --devices 6
"""

from __future__ import annotations

import argparse
import copy

import torch
from torch import nn
from torch.nn import functional as F

from adaptplan import PilotRun, Planner, build_chain, generate_system, profile_model, total_latency
from adaptplan.crossing import first_crossing

CLASSES, SIDE = 10, 8                  # your data: 1x8x8 "images" of 10 classes


def make_data(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Your own data set, here a Gaussian blob per class in 64 dimensions (noise 2.5x the class means' spread)."""
    generator = torch.Generator().manual_seed(seed)
    means = torch.randn(CLASSES, 1, SIDE, SIDE, generator=torch.Generator().manual_seed(1234))
    y = torch.randint(0, CLASSES, (samples,), generator=generator)
    return means[y] + 2.5 * torch.randn(samples, 1, SIDE, SIDE, generator=generator), y


def make_model() -> nn.Sequential:
    """Your model: three blocks, so cut points 1, 2 and 3 (a device at cut c runs blocks 1..c)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Flatten(), nn.Linear(SIDE * SIDE, 32), nn.ReLU()),
                         nn.Sequential(nn.Linear(32, 32), nn.ReLU()), nn.Linear(32, CLASSES))


def split_training(cuts: tuple[int, ...], interval: int, rounds: int, lr: float, batch: int, eval_every: int,
                   train: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor],
                   seed: int) -> list[tuple[int, float]]:
    """Your training loop (AdaptSFL's scheme): every round each device takes one SGD step on its own data through its
    device-side blocks and its server-side blocks; the server-side blocks are averaged every round, the device-side
    ones every ``interval`` rounds, block by block over the devices that hold it there. Returns (round, test
    accuracy) every ``eval_every`` rounds, of the model averaged over devices."""
    torch.manual_seed(seed)
    x, y = train
    shards = torch.arange(len(y)).chunk(len(cuts))                          # device i's samples
    models = [make_model() for _ in cuts]
    optimizers = [torch.optim.SGD(m.parameters(), lr=lr) for m in models]
    evaluations = []
    for t in range(1, rounds + 1):
        for model, optimizer, shard in zip(models, optimizers, shards):
            pick = shard[torch.randint(len(shard), (batch,))]
            optimizer.zero_grad()
            F.cross_entropy(model(x[pick]), y[pick]).backward()              # device half, then server half
            optimizer.step()
        for j in range(len(models[0])):                                       # block j + 1
            server_side = [m for m, c in zip(models, cuts) if j >= c]
            device_side = [m for m, c in zip(models, cuts) if j < c] if t % interval == 0 else []
            for group in (server_side, device_side):
                average(group, j)
        if t % eval_every == 0:
            global_model = copy.deepcopy(models[0])
            average([global_model, *models[1:]], None)
            with torch.no_grad():
                accuracy = (global_model(test[0]).argmax(1) == test[1]).float().mean().item()
            evaluations.append((t, accuracy))
    return evaluations


def average(models: list[nn.Sequential], block: int | None) -> None:
    """Set block ``block`` (every block: None) of every model in ``models`` to their mean."""
    if len(models) < 2:
        return
    parts = [m if block is None else m[block] for m in models]
    with torch.no_grad():
        for tensors in zip(*(p.parameters() for p in parts)):
            mean = torch.stack(tensors).mean(0)
            for tensor in tensors:
                tensor.copy_(mean)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=6, help="number of devices")
    parser.add_argument("--target", type=float, default=0.7, help="the test accuracy to reach (a fraction)")
    parser.add_argument("--lr", type=float, default=0.05, help="the learning rate γ you train with")
    parser.add_argument("--rounds", type=int, default=300, help="the most rounds a run trains")
    parser.add_argument("--eval-every", type=int, default=5, help="rounds between test evaluations")
    args = parser.parse_args(argv)
    batch, train, test = 16, make_data(3000, seed=0), make_data(1000, seed=1)

    model = make_model()
    chain = build_chain(model, train[0][:1])                                  # the blocks the cuts refer to
    profile = profile_model(model, (1, SIDE, SIDE), model_name="own-loop-mlp")
    planner = Planner(profile, generate_system(args.devices, seed=0))
    batches = [(train[0][k:k + batch], train[1][k:k + batch]) for k in range(0, 8 * batch, batch)]
    planner.estimate(chain, batches, gamma=args.lr)                           # Algorithm 1: constants of your run

    def run(cuts: tuple[int, ...], interval: int, seed: int) -> list[tuple[int, float]]:
        return split_training(cuts, interval, args.rounds, args.lr, batch, args.eval_every, train, test, seed)

    deepest = profile.num_cuts - 1
    pilots = []
    for interval in (1, 8):                                                  # two pilots: every device at cut L − 1
        found = first_crossing([(a, t) for t, a in run((deepest,) * args.devices, interval, seed=1)], args.target)
        if found is None:
            raise SystemExit(f"the pilot with I = {interval} never reached {args.target:.0%}: lower --target")
        pilots.append(PilotRun(f"pilot I={interval}", interval, deepest, args.target, found.at[0]))
    fit = planner.calibrate(pilots)
    print(f"calibrated: {fit.message}")

    plan = planner.plan()
    prediction = planner.predict(plan)
    print(f"plan: cuts {plan.cuts}, I = {plan.interval}; {prediction.describe()}")
    evaluations = run(plan.cuts, plan.interval, seed=2)
    seconds = [(t, a, total_latency(t, plan.interval, plan.round_latency_s, plan.aggregation_latency_s))
               for t, a in evaluations]                                       # eq. (26)'s clock at each evaluation
    print(planner.compare(prediction, seconds).describe())


if __name__ == "__main__":
    main()
