"""Time `profile_model` on VGG-16 at 3x32x32 (target < 30 s on 2 CPU cores).

Usage: python benchmarks/profile_vgg16.py [--measure-time]
Prints seconds for model construction, chain building and FLOP counting (wall clock).
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--measure-time", action="store_true", help="also time the blocks (batch 16, 5 repeats)")
    args = parser.parse_args()
    start = time.perf_counter()
    from profilers.chain import build_chain
    from profilers.models import resolve_model
    from profilers.profile import profile_model
    from profilers.tracing import example_batch

    model = resolve_model("vgg16")
    built = time.perf_counter()
    chain = build_chain(model, example_batch((3, 32, 32)))
    chained = time.perf_counter()
    profile = profile_model(chain, (3, 32, 32), model_name="vgg16", measure_time=args.measure_time)
    done = time.perf_counter()
    print(f"threads={torch.get_num_threads()} cuts={profile.num_cuts}")
    print(f"imports+model {built - start:.2f} s, build_chain {chained - built:.2f} s, "
          f"profile {done - chained:.2f} s, total {done - start:.2f} s")


if __name__ == "__main__":
    main()
