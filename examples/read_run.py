"""Read a run folder (docs/api.md, docs/formats.md "Training history"): its configuration, its rounds, when it
first reached an accuracy, and how the simulated seconds split into stages. Run:
python examples/read_run.py runs/compare/psl --target 0.5
"""

from __future__ import annotations

import argparse

from adaptplan import History


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run folder (adaptplan train --out RUN)")
    parser.add_argument("--target", type=float, default=0.5, help="the accuracy to find the first round of")
    args = parser.parse_args(argv)

    history = History.load(args.run)
    config = history.meta["config"]
    print(f"{config['algorithm']} on {config['dataset']}, {config['devices']} devices, {len(history.records)} rounds")
    evaluated = [r for r in history.records if r.accuracy is not None]
    for r in evaluated:
        print(f"round {r.round:>4}: accuracy {r.accuracy:.3f}, loss {r.train_loss:.4f}, {r.sim_seconds:.2f} simulated s")
    reached = next((r for r in evaluated if r.accuracy >= args.target), None)
    print(f"accuracy {args.target} first at round {reached.round} ({reached.sim_seconds:.2f} s)" if reached
          else f"accuracy {args.target} not reached")
    stages: dict[str, float] = {}
    for r in history.records:
        for stage, seconds in r.stage_seconds.items():
            stages[stage] = stages.get(stage, 0.0) + seconds
    print("seconds per stage: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(stages.items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    main()
