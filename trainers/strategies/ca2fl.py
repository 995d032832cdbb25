"""CA²FL (Wang et al., "Tackling the data heterogeneity in asynchronous federated learning with cached update
calibration", ICLR 2024) as GAS's paper runs it as a baseline (its authors' baseline/CA2FL.py), written against
docs/algorithms.md "CA²FL".

FedBuff's asynchronous loop (trainers/strategies/fedbuff.py: C devices always training the whole model, E local
steps each from the model it held when it joined, then its upload and an idle device drawn for its slot), with the
server's update calibrated by cached updates instead of averaging the buffered models:

- each finished device k's update h_k = w_k − w_k^start (its model at upload minus its model when it joined) is
  cached, replacing k's previous one (every cache starts at 0);
- every C uploads (the buffer, ``user_parti_num`` in the authors' code) the global model steps by every device's
  cache, weighted by its share of the data: w ← w + Σ_{i=1}^{N} p_i h_i, p_i = |𝒟_i| / Σ_j |𝒟_j| — stale caches of
  devices that did not upload since included (the calibration), which FedBuff's average of the buffer leaves out.

What this is not: the ICLR paper's own rule could not be read here (only its abstract is reachable); the GAS
authors' code is what is followed, the baseline the GAS paper's figures show. Their simulation loads a device's
start model at the moment its whole local training is computed, which by Python aliasing is the freshest global
model; here a device starts from the global model it downloaded when it joined (the protocol both papers state,
and FedBuff's convention here), so its update can be stale (docs/algorithms.md states the gap).

How it runs here: the calibrated global model is computed where the buffer is (the edge server, GAS-11's buffer)
and sent to the fed server as one upload, which its average keeps exactly; before any average the start model is
the initial one w⁰ (``begin``), or a device's own last upload when it is drawn again before the first average (it
downloads nothing then, as in the authors' code). Memory: one cached update per device that has uploaded (N
whole models at most) and the start model of each active device (shared between devices that joined at the same
version).
"""

from __future__ import annotations

from typing import Any

import torch

from trainers.api import BlockState, BufferedAsyncStrategy, ModelUpload, RoundContext

Blocks = dict[int, dict[str, torch.Tensor]]
"""A whole model as block index → state dict."""


def _difference(end: Blocks, start: Blocks) -> Blocks:
    """h = end − start, entry by entry (floating entries only: counters such as BatchNorm's are no update)."""
    return {j: {k: v - start[j][k] for k, v in state.items() if v.is_floating_point()} for j, state in end.items()}


def calibrated_step(global_blocks: Blocks, caches: dict[int, Blocks], shares: dict[int, float],
                    counters: Blocks) -> Blocks:
    """w + Σ_i p_i h_i over the cached devices in index order (GAS authors' CA2FL.py); integer entries (counters)
    are taken from ``counters`` (the last upload's)."""
    out: Blocks = {}
    for j, state in global_blocks.items():
        out[j] = {}
        for k, v in state.items():
            if not v.is_floating_point():
                out[j][k] = counters[j][k].clone()
                continue
            total = v.clone()
            for i in sorted(caches):
                total = total + caches[i][j][k] * shares[i]
            out[j][k] = total
    return out


class CA2FL(BufferedAsyncStrategy):
    name = "ca2fl"

    def __init__(self, active: int = 0, local_steps: int = 20) -> None:
        super().__init__(active, local_steps)
        self.global_blocks: Blocks = {}          # w: the initial model, then each calibrated step's result
        self.start: dict[int, Blocks] = {}       # w_k^start of each active device (shared objects, not copies)
        self.cache: dict[int, Blocks] = {}       # h_k of each device that has uploaded
        self.last: dict[int, Blocks] = {}        # each device's upload before the first average (it may rejoin)
        self.averaged = False

    def begin(self, ctx: RoundContext, initial: Blocks) -> None:
        self.global_blocks = initial

    def first_devices(self, ctx: RoundContext) -> list[int]:
        first = super().first_devices(ctx)
        self.start = {d: self.global_blocks for d in first}
        return first

    def replace(self, ctx: RoundContext, finished: int, active: Any) -> int:
        """The API's draw; the new device's start model is what it holds once joined: the global model after an
        average, before one its own last upload or w⁰."""
        new = super().replace(ctx, finished, active)
        self.start.pop(finished, None)
        self.start[new] = self.global_blocks if self.averaged else self.last.get(new, self.global_blocks)
        return new

    def on_model(self, ctx: RoundContext, upload: ModelUpload) -> list[ModelUpload] | None:
        """Cache the finished device's update h_k = w_k − w_k^start, then buffer it (the strategy API's buffer)."""
        blocks = {j: dict(b.state) for j, b in upload.blocks.items()}
        self.cache[upload.device] = _difference(blocks, self.start[upload.device])
        if not self.averaged:
            self.last[upload.device] = blocks
        return super().on_model(ctx, upload)

    def flush_buffer(self, ctx: RoundContext, buffered: list[ModelUpload]) -> list[ModelUpload]:
        """Every C uploads: one upload of the calibrated global model w + Σ_i p_i h_i (integer entries from the
        last upload), which the fed server's average keeps as it is."""
        total = float(sum(ctx.data_sizes))
        shares = {i: ctx.data_sizes[i] / total for i in self.cache}
        last = buffered[-1]
        self.global_blocks = calibrated_step(self.global_blocks, self.cache, shares,
                                             {j: dict(b.state) for j, b in last.blocks.items()})
        self.averaged, self.last = True, {}
        return [ModelUpload(last.device, last.round, "edge",
                            {j: BlockState(state) for j, state in self.global_blocks.items()}, 1.0)]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "global": self.global_blocks, "start": dict(self.start),
                "cache": dict(self.cache), "last": dict(self.last), "averaged": self.averaged}

    def check_state(self, ctx: RoundContext) -> None:
        """The buffer's check; every start, cache and last upload a whole model of a device of the run
        (ValueError otherwise)."""
        super().check_state(ctx)
        blocks = set(range(ctx.num_blocks))
        if set(self.global_blocks) != blocks:
            raise ValueError(f"CA²FL's global model must hold the {ctx.num_blocks} blocks")
        for name, kept in (("start", self.start), ("cache", self.cache), ("last", self.last)):
            if not all(isinstance(d, int) and 0 <= d < ctx.num_devices and isinstance(m, dict) and set(m) == blocks
                       for d, m in kept.items()):
                raise ValueError(f"CA²FL's {name} must map devices of 0..{ctx.num_devices - 1} to whole models "
                                 f"({ctx.num_blocks} blocks)")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.global_blocks, self.averaged = state["global"], bool(state["averaged"])
        self.start, self.cache, self.last = dict(state["start"]), dict(state["cache"]), dict(state["last"])
