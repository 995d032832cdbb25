"""Compare split algorithms in a loop (docs/api.md): every method trains with ONE setting — the same data,
partition, model, cut, optimizer, learning rate, batch, participation and rounds — as a fair comparison must; only
the algorithm changes. Run:  python examples/compare_algorithms.py --rounds 20 --out runs/compare
"""

from __future__ import annotations

import argparse

from adaptplan import TrainConfig, train

SETTING = dict(dataset="synthetic", model="mlp", devices=4, cuts=[2, 2, 2, 2], partition="iid", optimizer="sgd",
               lr=0.05, client_lr=0.05, server_lr=0.05, momentum=0.0, weight_decay=0.0, clip_norm=0.0,
               batch_size=16, seed=0, interval=1)
"""The one training setting every algorithm below shares (printed with the table)."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", default="psl,sfl-v1,sfl-v2,adaptsfl", help="comma-separated")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", default=None, help="a folder for one run folder per algorithm (optional)")
    args = parser.parse_args(argv)

    print("setting: " + ", ".join(f"{k}={v}" for k, v in SETTING.items()) + f", rounds={args.rounds}")
    print(f"{'algorithm':<10} {'accuracy':>8} {'sim s':>8} {'MB up':>8}")
    for algorithm in args.algorithms.split(","):
        out = f"{args.out}/{algorithm}" if args.out else None
        config = TrainConfig.flat(algorithm=algorithm, rounds=args.rounds, eval_every=args.rounds, out=out,
                                  **SETTING)
        history = train(config)
        last = history.records[-1]
        print(f"{algorithm:<10} {history.final_accuracy:>8.3f} {last.sim_seconds:>8.2f} "
              f"{sum(r.bytes_up for r in history.records) / 1e6:>8.2f}")


if __name__ == "__main__":
    main()
