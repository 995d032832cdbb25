"""Checks for a machine with a CUDA GPU (docs/architecture.md "Devices and batching"); a CPU-only
machine runs the CPU half and says what it skipped.

1. Every algorithm runs 3 rounds of a small CNN on the synthetic data on the CPU and on CUDA, with
   client batching off and on, with every device taking part and (``--participation``, default 0.5, for
   the algorithms that draw participants) with half of them, so that late devices download the global
   model; the script prints the largest difference of the round losses and of all parameters against
   the CPU per-device run (TF32 off, so only summation order differs).
2. A run checkpointed on CUDA resumes on the CPU (and the other way round) through the CLI.

Usage: python benchmarks/device_check.py [--rounds 3] [--algorithm gapsl,psl]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def engines(algorithm: str, device: str, batching: str, rounds: int,
            participation: float = 1.0) -> tuple[list[float], list[torch.Tensor]]:
    from trainers.engine.split_engine import DeviceData, SplitEngine
    from trainers.inputs.datasets import load_dataset
    from trainers.inputs.models import cnn
    from trainers.inputs.partition import partition_indices
    from trainers.strategies import make_strategy

    torch.manual_seed(0)
    d = load_dataset("synthetic")
    data = DeviceData(d.x_train, d.y_train, d.x_test, d.y_test, partition_indices(d.y_train.numpy(), 4, "iid", 0))
    options = {"gas": {"active": 2, "local_steps": 2}}.get(algorithm, {})
    if participation < 1:
        options = {**options, "participation": participation}
    from trainers.algorithms import REGISTRY

    model = cnn(1, 8, 10, width=4)
    cuts = [REGISTRY[algorithm].cut_for(3, len(model))] * 4          # FedAvg's kind: the whole model, cut L
    e = SplitEngine(model, cuts, make_strategy(algorithm, options), data,
                    {"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4}, batch_size=16, interval=2, total_rounds=rounds,
                    device=device, client_batching=batching)
    losses = [e.run_round(t).loss for t in range(1, rounds + 1)]
    e.evaluate(e.global_model())
    params = [p.detach().cpu() for dev in e.devices for p in dev.blocks.parameters()]
    params += [p.detach().cpu() for m in e.edge.instances.values() for p in m.parameters()]
    return losses, params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--algorithm", default="all", help="comma-separated algorithms to check (default all)")
    parser.add_argument("--participation", type=float, default=0.5,
                        help="the fraction of devices drawn per round in the second check of the algorithms that "
                             "draw participants (default 0.5; 1 skips it)")
    args = parser.parse_args()
    from trainers.config.train_config import ALGORITHMS

    chosen = ALGORITHMS if args.algorithm == "all" else tuple(args.algorithm.split(","))
    unknown = sorted(set(chosen) - set(ALGORITHMS))
    if unknown:
        parser.error(f"--algorithm: unknown {', '.join(unknown)} (choose from {', '.join(ALGORITHMS)})")

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cuda = torch.cuda.is_available()
    sides = [("cpu", "on")] + ([("cuda", "off"), ("cuda", "on")] if cuda else [])
    if not 0 < args.participation <= 1:
        parser.error(f"--participation: a fraction in (0, 1], got {args.participation}")
    from trainers.config.train_config import ALGORITHM_OPTIONS

    drawing = {a for o in ALGORITHM_OPTIONS if o.name == "participation" for a in o.algorithms}
    for algorithm in chosen:
        for rho in (1.0, args.participation) if algorithm in drawing and args.participation < 1 else (1.0,):
            ref_losses, ref_params = engines(algorithm, "cpu", "off", args.rounds, rho)
            cells = []
            for device, batching in sides:
                losses, params = engines(algorithm, device, batching, args.rounds, rho)
                loss_err = max(abs(a - b) for a, b in zip(ref_losses, losses))
                param_err = max(float((a - b).abs().max()) for a, b in zip(ref_params, params))
                cells.append(f"{device}/{batching}: loss {loss_err:.1e} params {param_err:.1e}")
            print(f"{algorithm:<9} ρ={rho:<4g} vs cpu/off   " + "   ".join(cells), flush=True)
    if not cuda:
        print("no CUDA here: the CUDA runs and the CUDA↔CPU resume were skipped")
        return
    base = [sys.executable, "-m", "adaptplan.cli", "train", "--dataset", "synthetic", "--devices", "3", "--batch-size",
            "8", "--cuts", "3", "--no-progress", "--eval-every", "2", "--checkpoint-every", "1"]
    with tempfile.TemporaryDirectory() as tmp:
        for first, then in (("cuda", "cpu"), ("cpu", "cuda")):
            out = str(Path(tmp) / f"{first}-{then}")
            subprocess.run([*base, "--rounds", "2", "--device", first, "--out", out], check=True, capture_output=True)
            done = subprocess.run([sys.executable, "-m", "adaptplan.cli", "train", "--out", out, "--resume", "--rounds",
                                   "4", "--device", then, "--no-progress"], capture_output=True, text=True)
            print(f"checkpoint written on {first}, resumed on {then}: exit code {done.returncode}")


if __name__ == "__main__":
    main()
