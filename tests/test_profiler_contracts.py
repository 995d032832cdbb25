"""profilers.chain input contracts and block bookkeeping: the example input must be a batch tensor, the
``children`` mode needs an ``nn.Sequential``, blocks are numbered from 1 in classes and messages, and a
parameter shared between two children of a Sequential is refused like one shared between traced blocks."""

import pytest
import torch
from torch import nn

from adaptplan.errors import InputError
from profilers import build_chain


class Gate(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it (forces the Sequential fallback)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.sum() > 0 else -x


@pytest.mark.parametrize("example", [[1.0, 2.0], torch.tensor(3.0), None])
def test_example_input_must_be_a_batch_tensor(example):
    with pytest.raises(InputError, match=r"example_input: must be a tensor of shape \(batch, \*input_shape\)"):
        build_chain(nn.Sequential(nn.Linear(2, 2)), example)


def test_block_modes():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    chain = build_chain(model, torch.randn(2, 4), blocks="children")
    assert chain.names == ["0", "1", "2"] and chain.output_shapes == [(8,), (8,), (3,)]
    with pytest.raises(InputError, match="blocks='children' needs an nn.Sequential, got Linear"):
        build_chain(nn.Linear(4, 3), torch.randn(2, 4), blocks="children")
    with pytest.raises(InputError, match="blocks: must be one of auto, children, got 'layers'"):
        build_chain(model, torch.randn(2, 4), blocks="layers")


def test_traced_blocks_are_numbered_from_one():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    chain = build_chain(model, torch.randn(2, 4))
    names = [type(block).__name__ for block in chain.blocks]
    assert names == [f"Block{j}" for j in range(1, len(names) + 1)]


class TiedTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.fc(x)))


def test_shared_parameters_are_refused_with_block_numbers():
    with pytest.raises(InputError, match=r"model: parameter '.*weight' is used in blocks 1 and 2"):
        build_chain(TiedTwice(), torch.randn(1, 4))
    first, last = nn.Linear(4, 4), nn.Linear(4, 4)
    last.weight = first.weight  # tied weights in two different children
    sequential = nn.Sequential(first, Gate(), last)  # untraceable → children fallback
    with pytest.raises(InputError, match=r"used in blocks 1 and 3.*untie"):
        build_chain(sequential, torch.randn(1, 4))
    with pytest.raises(InputError, match=r"used in blocks 1 and 3"):
        build_chain(sequential, torch.randn(1, 4), blocks="children")


def test_a_module_repeated_in_a_sequential_is_not_dropped():
    """nn.Sequential(a, gate, a) applies ``a`` twice: the chain must keep three blocks (and so refuse the
    parameters shared by blocks 1 and 3) instead of silently profiling a two-block model."""
    shared = nn.Linear(4, 4)
    for blocks in ("auto", "children"):
        with pytest.raises(InputError, match=r"used in blocks 1 and 3"):
            build_chain(nn.Sequential(shared, Gate(), shared), torch.randn(2, 4), blocks=blocks)
    relu = nn.ReLU()  # a parameter-free module may repeat
    model = nn.Sequential(nn.Linear(4, 4), relu, nn.Linear(4, 2), relu)
    chain = build_chain(model, torch.randn(2, 4), blocks="children")
    assert chain.names == ["0", "1", "2", "3"]
    x = torch.randn(3, 4)
    assert torch.equal(chain.blocks(x), model(x))
