"""How a run is executed, apart from what it computes: one :class:`Execution` resolved once from the options
(``--device``, ``--client-batching``, ``--server-pass-samples``, ``--client-recompute``, concatenation at shared
server instances) and handed to the runtime (:class:`trainers.engine.split_engine.SplitEngine`). Nothing here changes a
number of the run, only where and in which pieces it is computed (docs/engine.md "Memory"); a strategy
never sees it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import torch
from torch import nn

from trainers.config.train_config import CLIENT_BATCHING, CLIENT_RECOMPUTE, RECOMPUTE_BYTES, check_choice, pass_samples
from trainers.roles.batching import use_batching


@dataclass(frozen=True)
class Execution:
    """The resolved execution policy of one run.

    Attributes:
        device: where every role's models and the data live.
        client_batching: devices of a group that share a cut run their client blocks as one call
            (:mod:`trainers.roles.batching`; ``auto`` resolves to on for CUDA, off on a CPU).
        server_pass_samples: the most samples one edge-server pass holds (a barrier over more is served in
            chunks); None = no limit. ``auto`` resolves to :data:`trainers.config.train_config.CPU_PASS_SAMPLES` on a CPU,
            :data:`trainers.config.train_config.SERVER_PASS_SAMPLES` on a GPU.
        client_recompute: ``auto``, ``on`` or ``off``: a device keeps only its input while it waits for its reply
            and recomputes its forward at backward time (:meth:`recompute`).
        concatenate: devices' activations that meet at a shared server instance run as one batch.
        defer_checks: the round's NaN/inf checks are read once, at its end (off the CPU, where each read waits
            for the device).
    """

    device: torch.device
    client_batching: bool
    server_pass_samples: int | None
    client_recompute: str
    concatenate: bool = True
    defer_checks: bool = False

    @classmethod
    def resolve(cls, device: torch.device | str = "cpu", client_batching: str = "auto",
                server_pass_samples: int | str | None = "auto", client_recompute: str = "auto",
                concatenate: bool = True) -> "Execution":
        """The policy for these option values (each choice checked: an InputError names the option)."""
        where = torch.device(device)
        return cls(where, use_batching(check_choice(client_batching, CLIENT_BATCHING, "client_batching"), where),
                   pass_samples(server_pass_samples, where.type),
                   check_choice(client_recompute, CLIENT_RECOMPUTE, "client_recompute"), bool(concatenate),
                   where.type != "cpu")

    def recompute(self, samples_by_cut: Mapping[int, int], bytes_per_sample: Callable[[int], float]) -> bool:
        """Whether the devices of a group recompute their forward at backward time; ``samples_by_cut``: the
        samples its devices draw in all, per cut; ``bytes_per_sample(cut)``: what a client graph to that cut keeps
        for backward per sample (:func:`graph_bytes_per_sample`). ``auto``: when their graphs would keep more
        than :data:`trainers.config.train_config.RECOMPUTE_BYTES` at once (a barrier served as its devices forward
        waits one server chunk at a time: within the pass budget, never recomputed by default)."""
        if self.client_recompute != "auto":
            return self.client_recompute == "on"
        return sum(n * bytes_per_sample(cut) for cut, n in samples_by_cut.items()) > RECOMPUTE_BYTES


def graph_bytes_per_sample(blocks: Iterable[nn.Module], inputs: torch.Tensor) -> float:
    """Bytes autograd keeps for backward per sample when ``blocks`` run forward on ``inputs`` (a batch of ≥ 2
    samples) in training mode: every tensor saved for backward, each storage once and whole (a saved view keeps
    all of its storage alive), the blocks' parameters left out, divided by the samples. Runs on a copy of the
    blocks under a forked random state, so that nothing of the run changes (BatchNorm statistics, the random
    stream of Dropout)."""
    probe = copy.deepcopy(nn.Sequential(*blocks)).train()
    params = {p.untyped_storage().data_ptr() for p in probe.parameters()}
    saved: dict[int, int] = {}          # storage address → its bytes

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    where = [inputs.device] if inputs.device.type == "cuda" else []
    with torch.random.fork_rng(devices=where), torch.enable_grad(), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        probe(inputs.clone())
    return sum(saved.values()) / inputs.shape[0]
