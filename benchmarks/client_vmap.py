"""Would batching the devices' client passes with ``torch.func.vmap`` speed up the engine?

Devices that share a cut run the same client blocks with different weights (they diverge between
aggregations), so they cannot simply be concatenated. ``vmap`` over stacked per-device parameters
(``torch.func.functional_call``) computes the same forward/backward in one call. This script
times, for the CIFAR-10 CNN chain of ``adaptplan train`` (traced, 5 cut points), N devices × b
samples: per-device client forward + backward (what the engine does) vs the vmapped version, and
prints the largest difference of the parameter gradients relative to their largest magnitude.

Usage: python benchmarks/client_vmap.py [--devices 20] [--batch-size 16] [--threads 1]
Measured on 2 shared CPU cores, torch 2.14, 1 thread, 20 devices × 16 samples: cut 1 per-device
≈ 100–130 ms vs vmapped ≈ 230–360 ms; cut 3 ≈ 320–470 ms vs 500–580 ms (vmap of a conv with
per-device weights becomes a grouped convolution, slow on CPU); gradients agree to ≈ 3e-6
relative. So on a CPU the engine keeps per-device client passes; ``--client-batching auto`` batches
them with this vmap only on CUDA (trainers/roles/batching.py, docs/engine.md "Batched client passes").
"""

from __future__ import annotations

import argparse
import copy
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    from torch.func import functional_call, vmap

    from profilers import build_chain
    from trainers.inputs.models import cnn

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.randn(args.devices, args.batch_size, 3, 32, 32)
    chain = build_chain(cnn(3, 32, 10, 32), x[0, :2]).blocks
    for cut in (1, 2, 3):
        clients = [copy.deepcopy(chain[:cut]) for _ in range(args.devices)]
        for d, client in enumerate(clients):           # distinct weights, as between aggregations
            with torch.no_grad():
                for p in client.parameters():
                    p.add_(0.01 * d)
        names = [n for n, _ in clients[0].named_parameters()]
        skeleton = copy.deepcopy(chain[:cut]).to("meta")

        def per_device() -> None:
            for d, client in enumerate(clients):
                out = client(x[d])
                out.backward(torch.ones_like(out))

        def batched() -> None:
            stacked = {n: torch.stack([dict(c.named_parameters())[n] for c in clients]) for n in names}
            out = vmap(lambda p, xs: functional_call(skeleton, p, (xs,)))(stacked, x)
            out.backward(torch.ones_like(out))

        grads = []
        for run in (per_device, batched):
            for c in clients:
                c.zero_grad(set_to_none=True)
            run()
            grads.append([p.grad.clone() for c in clients for p in c.parameters()])
        same = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)) for a, b in zip(*grads))
        times = {}
        for run in (per_device, batched, per_device, batched):
            run()
            start = time.perf_counter()
            for _ in range(args.repeats):
                run()
            seconds = (time.perf_counter() - start) / args.repeats
            times[run.__name__] = min(times.get(run.__name__, seconds), seconds)
        print(f"cut {cut}: per-device {times['per_device'] * 1e3:7.1f} ms   vmapped {times['batched'] * 1e3:7.1f} ms   "
              f"max relative gradient difference {same:.1e}")


if __name__ == "__main__":
    main()
