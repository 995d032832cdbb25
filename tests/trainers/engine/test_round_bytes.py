"""The bytes a round records (RoundStats.bytes_up / bytes_down, docs/formats.md "bytes_up"), recomputed from the
model and the cuts in plain torch, for a round with an average and devices at three different cuts: each device
sends its activations (b samples at its cut, float32) and labels (int64) and, in the averaging round, its client
blocks — those below its own cut, never the deeper ones another device holds — and receives the gradients of its
activations and the average of its client blocks."""

from __future__ import annotations

import torch

from tests.engine_builders import B, make_engine, small_model

CUTS = [1, 4, 7]


def _expected() -> tuple[int, int, int]:
    """(activation bytes, label bytes, client-block bytes) summed over the devices, from the model itself."""
    blocks = list(small_model().children())
    x = torch.zeros(B, 1, 8, 8)
    activations = labels = client = 0
    for cut in CUTS:
        activations += 4 * torch.nn.Sequential(*blocks[:cut])(x).numel()
        labels += 8 * B
        client += 4 * sum(p.numel() for block in blocks[:cut] for p in block.parameters())
    return activations, labels, client


def test_a_round_with_an_average_moves_each_devices_own_client_blocks() -> None:
    activations, labels, client = _expected()
    assert (activations, labels, client) == (16384 + 8192 + 2048, 3 * 16 * 8, 4 * (40 + 336 + 920))   # spelled out
    averaged = make_engine("adaptsfl", CUTS, 3, interval=1).run_round(1)
    assert averaged.aggregated
    assert averaged.bytes_up == activations + labels + client
    assert averaged.bytes_down == activations + client
    plain = make_engine("adaptsfl", CUTS, 3, interval=2).run_round(1)
    assert not plain.aggregated and (plain.bytes_up, plain.bytes_down) == (activations + labels, activations)
