"""What a recipe costs at its paper's scale (``adaptplan bench papers --data-root DIR --device cuda``), measured
before anyone commits a GPU for days to it.

Every method of every recipe (``adaptplan/benches/recipes/*.toml``), at the recipe's ``[paper_scale]`` (the paper's model,
cut, batch, rounds; devices, participation and rates as the recipe says), runs ``--rounds`` engine rounds (no evaluation) of its first
partition with seed 0 on ``--device``, exactly as ``bench papers`` would build the run; the script prints wall
seconds per round (after the first, which warms up), the rounds the paper-scale run has, and the projected hours of
one seed of that method, and the recipe's total over its methods, partitions and ``--seeds``.

The data: with ``--data-root`` the paper's own (torchvision's files). Without it a **stand-in** of the same shape:
the shipped CIFAR-10 subset tiled to CIFAR's 50,000 training and 10,000 test images (for CIFAR-100 the k-th tile's
labels shifted by 10k, so that every one of the 100 classes has samples). The time of a round depends on the model,
the batch, the devices drawn and the cut, not on which images they are, so the projection holds for the real set;
its accuracies mean nothing and are not printed.

Usage: python benchmarks/paper_scale.py [--paper scala,gas] [--rounds 6] [--device cuda] [--seeds 3]
"""

from __future__ import annotations

import argparse
import time

SIZES = {"cifar10": (50_000, 10_000, 10), "cifar100": (50_000, 10_000, 100)}
"""Training images, test images, classes of the paper-scale data sets the stand-in imitates."""


def tile(x, y, n: int, classes: int):
    """The first ``n`` samples of ``x`` repeated; the k-th copy's labels shifted by 10k modulo ``classes`` (so that
    a 10-class set fills the 100 classes of CIFAR-100)."""
    import torch

    copies = -(-n // len(x))
    shift = torch.arange(copies).repeat_interleave(len(x)) * 10
    return x.repeat(copies, *([1] * (x.dim() - 1)))[:n], ((y.repeat(copies) + shift) % classes)[:n]


def stand_in(name: str):
    """The shipped CIFAR-10 subset tiled to ``name``'s size (module docstring)."""
    from trainers.inputs.datasets import Dataset, load_dataset

    if name not in SIZES:
        raise SystemExit(f"no stand-in for {name!r} (only {', '.join(SIZES)}): pass --data-root")
    n_train, n_test, classes = SIZES[name]
    subset = load_dataset("cifar10-subset")
    x_train, y_train = tile(subset.x_train, subset.y_train, n_train, classes)
    x_test, y_test = tile(subset.x_test, subset.y_test, n_test, classes)
    return Dataset(x_train, y_train, x_test, y_test, classes, subset.input_shape, f"{name} (stand-in)",
                   subset.mean, subset.std)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paper", default="all", help="comma-separated recipes (default all)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds measured per method (default 6; the first warms up)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds the projected total counts (default 3)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--data-root", default=None, help="the paper-scale data sets' folder (default: the stand-in)")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds: at least 2 (the first warms up)")
    import torch

    from adaptplan.benches import recipes
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    names = recipes.NAMES if args.paper == "all" else tuple(args.paper.split(","))
    unknown = sorted(set(names) - set(recipes.NAMES))
    if unknown:
        parser.error(f"--paper: unknown {', '.join(unknown)} (choose from {', '.join(recipes.NAMES)})")
    cache: dict[str, object] = {}
    print(f"{'recipe':<9} {'method':<12} {'model':<15} {'N':>4} {'b':>4} {'s/round':>9} {'rounds':>7} "
          f"{'h per seed':>10}", flush=True)
    for name in names:
        recipe = recipes.load(name)
        scaled = recipe.at_paper_scale(args.data_root or "stand-in")
        first = scaled.partitions[0].label
        jobs = [j for j in scaled.jobs([0], args.device) if j["group"].endswith("/" + first)]
        total_h = 0.0
        for job in jobs:
            config = dict(job["config"])
            paper_rounds = int(config["rounds"])
            config.update(rounds=args.rounds, eval_every=args.rounds, max_test_samples=1000, progress=False)
            if args.data_root is None:
                config.pop("data_root", None)
                if config["dataset"] not in cache:           # tiled once per data set, not once per method
                    cache[config["dataset"]] = stand_in(config["dataset"])
                dataset = cache[config["dataset"]]
                config["dataset"] = "cifar10-subset"            # the name only: the samples are the stand-in's
            else:
                dataset = None
            trainer = Trainer(TrainConfig.flat(**config), data=dataset)
            stamps = []
            for t in range(1, args.rounds + 1):          # the engine's rounds alone: no evaluation, no re-plan
                trainer.engine.run_round(t)
                if trainer.device.type == "cuda":
                    torch.cuda.synchronize()
                stamps.append(time.perf_counter())
            per_round = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
            wall = stamps[-1] - stamps[0]
            hours = per_round * paper_rounds / 3600
            total_h += hours * len(scaled.partitions) * args.seeds
            print(f"{name:<9} {job['label']:<12} {scaled.run['model']:<15} {config['devices']:>4} "
                  f"{config['batch_size']:>4} {per_round:>9.3f} {paper_rounds:>7} {hours:>10.2f}   "
                  f"({wall:.1f} s measured)", flush=True)
        print(f"{name:<9} all {len(scaled.methods)} methods × {len(scaled.partitions)} partition(s) × {args.seeds} "
              f"seeds: {total_h:.1f} h on {torch.cuda.get_device_name() if trainer.device.type == 'cuda' else 'the cpu'}",
              flush=True)


if __name__ == "__main__":
    main()
