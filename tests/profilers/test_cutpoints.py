"""Cut points and the chain of blocks (profilers.cutpoints / profilers.chain)."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
import torchvision
from torch import nn

from adaptplan.errors import InputError
from profilers import build_chain
from profilers.cutpoints import single_tensor_positions
from profilers.tracing import trace


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "small":
        return SmallCNN().eval()
    return torchvision.models.get_model(name, weights=None, num_classes=10).eval()


X32 = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
X16 = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def resnet():
    model = _model("resnet18")
    return model, build_chain(model, X32)


@pytest.mark.parametrize("name", ["vgg16", "resnet18", "mobilenet_v2", "small"])
def test_chain_output_equals_model_exactly(name: str) -> None:
    model = _model(name)
    x = X16 if name == "small" else X32
    chain = build_chain(model, x)
    with torch.no_grad():
        assert torch.equal(chain.blocks.eval()(x), model(x))
        # a split point: client part then server part reproduces the model
        cut = len(chain) // 2
        assert torch.equal(chain.server(cut)(chain.client(cut)(x)), model(x))


def test_vgg16_cuts_one_per_conv_and_linear_layer() -> None:
    chain = build_chain(_model("vgg16"), X32)
    assert len(chain) == 16  # 13 conv + 3 linear, as L = 16 in the paper
    assert chain.names == ["features.1", "features.4", "features.6", "features.9", "features.11", "features.13",
                           "features.16", "features.18", "features.20", "features.23", "features.25",
                           "features.27", "features.30", "classifier.2", "classifier.5", "classifier.6"]
    # pooling joins the conv it follows (smaller activation); 32x32 → 1x1 after pool5
    assert chain.output_shapes[:4] == [(64, 32, 32), (64, 16, 16), (128, 16, 16), (128, 8, 8)]
    assert chain.output_shapes[12] == (512, 1, 1)
    assert chain.output_shapes[13:] == [(4096,), (4096,), (10,)]


def test_resnet18_is_cut_only_between_residual_blocks(resnet) -> None:
    model, chain = resnet
    assert chain.names == ["maxpool", "layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1",
                           "layer4.0", "avgpool", "fc"]
    assert chain.output_shapes[1] == (64, 8, 8)
    assert chain.output_shapes[7] == (512, 1, 1)
    assert chain.output_shapes[8] == (512,)
    # the skip connections alone rule out every interior node of a BasicBlock
    gm = trace(model)
    from torch.fx.passes.shape_prop import ShapeProp
    ShapeProp(gm).propagate(X32)
    last_of: dict[str, object] = {}
    for node in gm.graph.nodes:
        for path in node.meta.get("nn_module_stack", {}):
            last_of[path] = node
    positions = single_tensor_positions(gm.graph)
    blocks = [f"layer{i}.{k}" for i in range(1, 5) for k in range(2)]
    for node in positions:
        for block in blocks:
            if block in node.meta.get("nn_module_stack", {}):
                # only the residual sum and the block output (relu of the sum) carry a single tensor
                assert last_of[block] is node or node.name.startswith("add"), f"{node.name} is inside {block}"
    block_outputs = [n for n in positions if any(last_of[b] is n for b in blocks)]
    assert len(block_outputs) == 8


def test_blocks_are_deepcopyable_picklable_and_loadable(resnet) -> None:
    model, chain = resnet
    with torch.no_grad():
        expected = model(X32)
        clone = copy.deepcopy(chain.blocks)
        assert torch.equal(clone(X32), expected)
        assert all(a.data_ptr() != b.data_ptr() for a, b in zip(clone.parameters(), chain.blocks.parameters()))
        restored = pickle.loads(pickle.dumps(chain.blocks))
        assert torch.equal(restored.eval()(X32), expected)
        other = build_chain(_model("resnet18").apply(lambda m: m.reset_parameters() if hasattr(m, "reset_parameters") else None), X32)
        buffer = io.BytesIO()
        torch.save(chain.blocks.state_dict(), buffer)
        buffer.seek(0)
        other.blocks.load_state_dict(torch.load(buffer))
        assert torch.equal(other.blocks.eval()(X32), expected)


def test_blocks_share_the_original_parameters(resnet) -> None:
    model, chain = resnet
    original = {p.data_ptr() for p in model.parameters()}
    assert {p.data_ptr() for p in chain.blocks.parameters()} == original
    assert sum(p.numel() for p in chain.blocks.parameters()) == sum(p.numel() for p in model.parameters())


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 4)
        self.gate = Gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.head(x))


class Gate(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow: untraceable
            return x
        return -x


def test_untraceable_model_names_the_module_and_the_fallback() -> None:
    with pytest.raises(InputError, match=r"gate \(Gate\).*nn.Sequential"):
        build_chain(DataDependent(), torch.randn(1, 4))


def test_sequential_fallback_uses_children_as_blocks() -> None:
    """The parameter-free Gate joins the Linear before it (equal sizes: the later position wins),
    so it does not become a zero-FLOP cut point of its own."""
    model = nn.Sequential(nn.Linear(4, 8), Gate(), nn.Linear(8, 3))
    chain = build_chain(model, torch.randn(2, 4))
    assert chain.names == ["1", "2"]
    assert chain.output_shapes == [(8,), (3,)]
    assert list(chain.blocks[0]) == [model[0], model[1]] and chain.blocks[1] is model[2]
    x = torch.randn(5, 4)
    assert torch.equal(chain.blocks(x), model(x))


def test_sequential_fallback_joins_relu_pool_flatten_to_their_layer() -> None:
    """conv → ReLU → pool → Gate → flatten → linear → ReLU → linear: one cut per parametrised layer,
    each after the smallest tensor in its window (the pooled map, 4·2·2 = 16 values, not the
    conv's 64), and no cut of zero FLOPs."""
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), Gate(), nn.Flatten(),
                          nn.Linear(16, 6), nn.ReLU(), nn.Linear(6, 2))
    chain = build_chain(model, torch.randn(1, 1, 4, 4))
    assert chain.names == ["4", "6", "7"]
    assert chain.output_shapes == [(16,), (6,), (2,)]
    x = torch.randn(3, 1, 4, 4)
    assert torch.equal(chain.blocks(x), model(x))


class TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor):
        y = self.fc(x)
        return y, y.sum()


def test_model_with_tuple_output_is_an_input_error() -> None:
    with pytest.raises(InputError, match="single output tensor"):
        build_chain(TwoOutputs(), torch.randn(1, 4))


class TiedWeights(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.fc(x)))


def test_weights_used_in_two_blocks_are_an_input_error() -> None:
    with pytest.raises(InputError, match="untie"):
        build_chain(TiedWeights(), torch.randn(1, 4))


def test_a_removed_layer_names_no_cut_and_sequential_indices_carry_their_class() -> None:
    """Issue 37's small things: resnet18-cifar's first cut was named after its removed max-pool (an nn.Identity),
    and the cuts of an nn.Sequential were bare indices ('2', '9.0')."""
    from trainers.inputs.models import build_model

    cifar = build_chain(build_model("resnet18-cifar", (3, 32, 32), 10), X32)
    assert cifar.names[:2] == ["relu", "layer1.0"]                  # the stem ends at its ReLU; 'maxpool' is gone
    plain = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Identity(),
                          nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Sequential(nn.Flatten(), nn.Linear(2048, 10)))
    assert build_chain(plain, X32).names == ["2:MaxPool2d", "6.0:Flatten", "6.1:Linear"]
