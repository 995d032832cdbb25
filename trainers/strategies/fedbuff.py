"""FedBuff (Nguyen et al., "Federated learning with buffered asynchronous aggregation", AISTATS 2022) as GAS's
paper runs it as a baseline (its authors' baseline/FedBuff.py), written against docs/algorithms.md "FedBuff".

Federated learning with no split (every device holds all L blocks) on the runtime's asynchronous loop, GAS's
set-up without its split: C devices (``--active``; 0 = ⌈N/2⌉) are always training, each from the global model it
downloaded when it joined, E local steps (``--local-steps``) of w ← w − η∇F_k(w; ξ) on its own mini-batches of b
samples; a device that finishes uploads its model and its slot goes to a device drawn uniformly from the idle
ones, which downloads the current global model. Every C finished models (FedBuff's buffer K = C, the authors'
``user_parti_num``) the fed server averages them, w ← Σ_k |𝒟_k| w_k / Σ_k |𝒟_k| — GAS-12's average, so that GAS
and its baselines share one convention (the authors' code weighs both uniformly, 1/C: equal for equal datasets) —
and the global version advances: one round of the history is one such average.

What this is not: Nguyen et al.'s FedBuff sends the update Δ_k = w_start − w_k, weighs it by the staleness
s(τ) = 1/√(1 + τ) and steps the global model by a server rate η_g; the GAS authors' baseline averages the
buffered models themselves, with no staleness weight and no server rate (docs/algorithms.md states the gap).

How it runs here: as FedAvg (trainers/strategies/fedavg.py), each local step's loss is computed by the edge server
role on the logits and labels the device sends (the server holds no blocks), which gives the device's update of
local training bit for bit; docs/algorithms.md states what that costs on the clock and what it reveals.
"""

from __future__ import annotations

from trainers.api import BufferedAsyncStrategy


class FedBuff(BufferedAsyncStrategy):
    """The buffer's models averaged as they are (the strategy API's default :meth:`flush_buffer`)."""

    name = "fedbuff"
