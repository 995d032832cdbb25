"""trainers.inputs.pooling.MaxPool2d: nn.MaxPool2d's outputs and input gradients bit for bit, by the gather path
on the CPU, and nn.MaxPool2d's own forward wherever that path does not apply."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from profilers import build_chain
from trainers.inputs.models import build_model
from trainers.inputs.pooling import MaxPool2d


def both(x: torch.Tensor, **options) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """(output, input gradient) of nn.MaxPool2d and of MaxPool2d for the same input and upstream gradient."""
    upstream = None
    results = []
    for module in (nn.MaxPool2d(**options), MaxPool2d(**options)):
        leaf = x.detach().clone().requires_grad_(True)
        out = module(leaf)
        if upstream is None:
            upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        out.backward(upstream)
        results.append((out.detach(), leaf.grad))
    return results[0], results[1]


@pytest.mark.parametrize("shape", [(16, 16, 32, 32), (3, 5, 7, 9), (2, 4, 3, 3)])
@pytest.mark.parametrize("kernel", [2, 3])
def test_outputs_and_input_gradients_equal_nn_maxpool2d_bit_for_bit(shape, kernel) -> None:
    """Random inputs after a ReLU (many zeros), and odd sizes (floor mode drops the last rows and columns)."""
    x = torch.relu(torch.randn(shape, generator=torch.Generator().manual_seed(0)))
    (out, grad), (fast_out, fast_grad) = both(x, kernel_size=kernel)
    assert torch.equal(out, fast_out) and torch.equal(grad, fast_grad)
    assert fast_out.is_contiguous() and fast_grad.is_contiguous()


def test_ties_go_to_the_same_input_element() -> None:
    """Windows of equal values (integers 0..2): each output's gradient lands on the element nn.MaxPool2d picks."""
    x = torch.randint(0, 3, (4, 3, 8, 8), generator=torch.Generator().manual_seed(0)).float()
    (out, grad), (fast_out, fast_grad) = both(x, kernel_size=2)
    assert torch.equal(out, fast_out) and torch.equal(grad, fast_grad)
    assert int((grad != 0).sum()) == out.numel()          # one element per window took the gradient


def test_without_gradients_the_output_is_the_same() -> None:
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        out = MaxPool2d(2)(x)
    assert torch.equal(out, F.max_pool2d(x, 2)) and out.is_contiguous()
    out = MaxPool2d(2)(x)                                              # an input that needs no gradient
    assert torch.equal(out, F.max_pool2d(x, 2)) and out.is_contiguous()


@pytest.mark.parametrize("options", [dict(kernel_size=3, stride=2), dict(kernel_size=2, padding=1),
                                     dict(kernel_size=2, dilation=2), dict(kernel_size=2, ceil_mode=True)])
def test_other_windows_run_nn_maxpool2d(options, monkeypatch) -> None:
    """Overlapping, padded, dilated or ceil-mode windows take nn.MaxPool2d's own forward (the gather's backward would
    add a shared input's gradients in another order), and so do 3-D inputs."""
    x = torch.randn(2, 3, 9, 9)
    monkeypatch.setattr(torch.Tensor, "gather", lambda *a, **k: pytest.fail("took the gather path"))
    (out, grad), (fast_out, fast_grad) = both(x, **options)
    assert torch.equal(out, fast_out) and torch.equal(grad, fast_grad)
    assert torch.equal(MaxPool2d(2)(x[0]), F.max_pool2d(x[0], 2))


def test_under_vmap_it_is_nn_maxpool2d() -> None:
    """torch.func.vmap (the client batching) cannot ask for a channels-last layout: nn.MaxPool2d's forward runs."""
    x = torch.randn(3, 2, 4, 8, 8)
    batched = torch.func.vmap(MaxPool2d(2))(x)
    assert torch.equal(batched, torch.stack([F.max_pool2d(xb, 2) for xb in x]))


def test_the_gather_path_runs_on_the_cpu_for_tiling_windows(monkeypatch) -> None:
    calls = []
    gather = torch.Tensor.gather
    monkeypatch.setattr(torch.Tensor, "gather", lambda *a, **k: calls.append(1) or gather(*a, **k))
    MaxPool2d(2)(torch.randn(2, 3, 8, 8, requires_grad=True))
    MaxPool2d(2, return_indices=True)(torch.randn(2, 3, 8, 8, requires_grad=True))
    with torch.no_grad():                           # no backward to route: the channels-last output as it is
        MaxPool2d(2)(torch.randn(2, 3, 8, 8, requires_grad=True))
    meta = MaxPool2d(2)(torch.empty(2, 3, 8, 8, device="meta", requires_grad=True))    # not a CPU tensor
    assert calls == [1] and meta.shape == (2, 3, 4, 4)


def test_models_use_it_and_the_chain_keeps_it_one_node() -> None:
    """The cnn and vgg16-cifar pool with it; torch.fx treats it as a leaf, so a block runs it as written, and
    TorchScript tracing (fvcore's FLOP tables) sees nn.MaxPool2d's op."""
    model = build_model("cnn", (3, 32, 32), 10, 8)
    assert sum(isinstance(m, MaxPool2d) for m in model.modules()) == 3
    assert sum(isinstance(m, MaxPool2d) for m in build_model("vgg16-cifar", (3, 32, 32), 10).modules()) == 5
    chain = build_chain(model, torch.randn(2, 3, 32, 32))
    first = chain.blocks[0]
    assert [n.op for n in first.graph.nodes].count("call_module") == 3
    assert isinstance(first.get_submodule("2"), MaxPool2d)
    graph = str(torch.jit.trace(MaxPool2d(2), torch.randn(1, 2, 4, 4, requires_grad=True)).graph)
    assert "aten::max_pool2d(" in graph and "with_indices" not in graph and "aten::gather" not in graph
