"""Measured forward/backward seconds per block on this machine (optional part of the profile).

Each block j is timed on its own input (the previous block's output for a random batch), in
training mode, with autograd on; the backward pass is ``out.backward(ones)`` with the block input
requiring a gradient for j ≥ 2 (as in the FLOP counts of :mod:`profilers.flops`). After
``warmup`` untimed passes, ``repeats`` timed passes are made; the statistic is the **median**,
divided by the batch size → **seconds per sample**. Parameter ``.grad`` is reset to ``None``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from adaptplan.errors import InputError


@dataclass(frozen=True)
class BlockTimes:
    """Per-block (not cumulative) median seconds per sample, index 0 ↔ block 1."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    batch_size: int
    repeats: int
    threads: int

    def timing_info(self) -> dict[str, Any]:
        """The ``timing`` object of the profile (docs/formats.md)."""
        return {"batch_size": self.batch_size, "repeats": self.repeats, "threads": self.threads, "statistic": "median"}


def measure_block_times(blocks: Iterable[nn.Module], input_shape: Sequence[int], batch_size: int = 16,
                        repeats: int = 5, warmup: int = 1, progress: bool = False, seed: int = 0) -> BlockTimes:
    """Time each block's forward and backward pass; see the module docstring.

    Args:
        blocks: the chain's blocks (``Chain.blocks``), applied in order.
        input_shape: per-sample input shape, e.g. ``(3, 32, 32)``.
        batch_size: samples per timed batch (≥ 2 so that BatchNorm can train).
        repeats: timed passes per block (median taken).
        warmup: untimed passes before timing.
        progress: show a tqdm bar over repeats.
    """
    if batch_size < 2:
        raise InputError(f"must be ≥ 2 (BatchNorm needs 2 samples in training mode), got {batch_size}", field="batch_size")
    if repeats < 1:
        raise InputError(f"must be ≥ 1, got {repeats}", field="repeats")
    blocks = list(blocks)
    modes = [b.training for b in blocks]
    generator = torch.Generator().manual_seed(seed)
    inputs = [torch.randn((batch_size, *input_shape), generator=generator)]
    forward: list[list[float]] = [[] for _ in blocks]
    backward: list[list[float]] = [[] for _ in blocks]
    try:
        for block in blocks:
            block.train()
        with torch.no_grad():
            for block in blocks[:-1]:
                inputs.append(block(inputs[-1]))
        passes = range(warmup + repeats)
        if progress:
            from tqdm import tqdm

            passes = tqdm(passes, desc="timing blocks", unit="pass", leave=False)
        for k in passes:
            for j, block in enumerate(blocks):
                fp, bp = _time_once(block, inputs[j], input_grad=j > 0)
                if k >= warmup:
                    forward[j].append(fp)
                    backward[j].append(bp)
    finally:
        for block, mode in zip(blocks, modes):
            block.train(mode)
            block.zero_grad(set_to_none=True)
    return BlockTimes(
        forward_s=tuple(statistics.median(t) / batch_size for t in forward),
        backward_s=tuple(statistics.median(t) / batch_size for t in backward),
        batch_size=batch_size, repeats=repeats, threads=torch.get_num_threads(),
    )


def _time_once(block: nn.Module, x: torch.Tensor, input_grad: bool) -> tuple[float, float]:
    """(forward seconds, backward seconds) of one pass of ``block`` on batch ``x``."""
    x = x.detach().requires_grad_(input_grad)
    start = time.perf_counter()
    out = block(x)
    middle = time.perf_counter()
    if out.requires_grad:
        out.backward(torch.ones_like(out))
    end = time.perf_counter()
    return middle - start, end - middle
