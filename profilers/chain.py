"""The model as a chain of blocks between consecutive cut points (DESIGN.md "Cut points").

``build_chain(model, example_input)`` returns a :class:`Chain` whose ``blocks`` is an
``nn.Sequential``; ``blocks[:l]`` is a device's client part for cut l and ``blocks[l:]`` the server
part. ``blocks(x)`` equals ``model(x)`` exactly.

Parameter sharing: each traced block is an ``fx.GraphModule`` that holds **the same submodule
objects** (hence the same parameter tensors) as ``model``; nothing is copied. A parameter belongs to
exactly one block (a module with parameters used in two blocks is an error, since it could not be
split between a device and the server). Use ``copy.deepcopy(chain.blocks)`` for independent
weights; blocks are deep-copyable and picklable, and ``state_dict``/``load_state_dict`` work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from adaptplan.errors import InputError
from profilers.cutpoints import choose_cuts, cut_names, input_node, node_shape
from profilers.tracing import trace


@dataclass
class Chain:
    """A model as L blocks; block j ends at cut point j (1-based), whose name is ``names[j-1]``.

    Attributes:
        blocks: ``nn.Sequential`` of L modules, each mapping the tensor at cut j−1 (cut 0 = the
            model input) to the tensor at cut j.
        names: name of the node/module at the end of each block (``CutPoint.name``).
        output_shapes: per-sample shape of the tensor crossing each cut (batch dimension
            dropped), from the example input.
    """

    blocks: nn.Sequential
    names: list[str]
    output_shapes: list[tuple[int, ...]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.blocks)

    def client(self, cut: int) -> nn.Sequential:
        """Blocks 1..cut (device side for cut point ``cut``)."""
        return self.blocks[:cut]

    def server(self, cut: int) -> nn.Sequential:
        """Blocks cut+1..L (server side for cut point ``cut``)."""
        return self.blocks[cut:]


BLOCK_MODES = ("auto", "children")


def build_chain(model: nn.Module, example_input: torch.Tensor, blocks: str = "auto") -> Chain:
    """Split ``model`` into the chain of blocks between its cut points.

    Args:
        model: any ``nn.Module`` traceable by torch.fx with one input and one output tensor.
        example_input: a batch ``(B, *input_shape)`` used to propagate shapes (B ≥ 1).
        blocks: ``"auto"`` (default) traces the model and cuts where the rule of
            :mod:`profilers.cutpoints` says; an ``nn.Sequential`` that fx cannot trace falls back
            to its children as the blocks. ``"children"`` takes an ``nn.Sequential``'s children as
            the blocks as they are (no tracing), for users who chunk the model themselves.

    Raises:
        InputError: untraceable model (naming the module/op), several inputs or outputs, or a
            parameterised module used in two blocks.
    """
    if not isinstance(example_input, torch.Tensor) or example_input.dim() < 1:
        raise InputError("must be a tensor of shape (batch, *input_shape)", field="example_input")
    if blocks not in BLOCK_MODES:
        raise InputError(f"must be one of {', '.join(BLOCK_MODES)}, got {blocks!r}", field="blocks")
    if blocks == "children":
        if not isinstance(model, nn.Sequential):
            raise InputError(f"blocks='children' needs an nn.Sequential, got {type(model).__name__}", field="blocks")
        return _sequential_chain(model, example_input)
    try:
        gm = trace(model)
    except InputError:
        if isinstance(model, nn.Sequential):
            return _sequential_chain(model, example_input)
        raise
    gm.graph.eliminate_dead_code()
    _propagate_shapes(gm, example_input)
    cuts = choose_cuts(gm).cuts
    blocks = nn.Sequential(*_split(gm, cuts))
    _check_parameters_owned_once(blocks)
    return Chain(blocks=blocks, names=cut_names(gm.graph, cuts), output_shapes=[node_shape(c) for c in cuts])


def _propagate_shapes(gm: fx.GraphModule, example_input: torch.Tensor) -> None:
    was_training = gm.training
    gm.eval()
    try:
        with torch.no_grad():
            ShapeProp(gm).propagate(example_input)
    except Exception as exc:
        raise InputError(
            f"running the model on an input of shape {tuple(example_input.shape)} failed: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}. Fix: check the input shape (channels × height × width)",
            field="input_shape",
        ) from None
    finally:
        gm.train(was_training)


def _split(gm: fx.GraphModule, cuts: list[fx.Node]) -> list[fx.GraphModule]:
    """One ``GraphModule`` per span (previous cut, cut]; the first span starts at the input."""
    order = {node: k for k, node in enumerate(gm.graph.nodes)}
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]
    blocks = []
    previous = input_node(gm.graph)
    for j, cut in enumerate(cuts, start=1):
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {previous: graph.placeholder("x")}
        for node in nodes:
            if not order[previous] < order[node] <= order[cut]:
                continue
            for source in node.all_input_nodes:
                if source not in env:
                    if source.op != "get_attr":  # cannot happen for a single-tensor cut
                        raise AssertionError(f"value {source.name} crosses cut {previous.name}")
                    env[source] = graph.node_copy(source)
            env[node] = graph.node_copy(node, lambda n: env[n])
        graph.output(env[cut])
        graph.lint()
        blocks.append(fx.GraphModule(gm, graph, class_name=f"Block{j}"))
        previous = cut
    return blocks


def _check_parameters_owned_once(blocks: nn.Sequential) -> None:
    owner: dict[int, str] = {}
    for j, block in enumerate(blocks, start=1):
        for name, parameter in block.named_parameters():
            if id(parameter) in owner and owner[id(parameter)] != str(j):
                raise InputError(
                    f"parameter {name!r} is used in blocks {owner[id(parameter)]} and {j}; a shared parameter "
                    "cannot be split between a device and the server. Fix: untie the weights",
                    field="model",
                )
            owner[id(parameter)] = str(j)


def _sequential_chain(model: nn.Sequential, example_input: torch.Tensor) -> Chain:
    """The fallback: the children of an ``nn.Sequential`` are the blocks."""
    if len(model) == 0:
        raise InputError("the nn.Sequential has no children", field="model")
    children = list(model._modules.items())  # not named_children(): it skips a module that appears twice
    names = [name for name, _ in children]
    shapes = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            x = example_input
            for name, child in children:
                x = child(x)
                if not isinstance(x, torch.Tensor):
                    raise InputError(f"child {name!r} returns {type(x).__name__}, not a tensor", field="model")
                shapes.append(tuple(int(s) for s in x.shape[1:]))
    finally:
        model.train(was_training)
    blocks = nn.Sequential(*(child for _, child in children))
    _check_parameters_owned_once(blocks)
    return Chain(blocks=blocks, names=names, output_shapes=shapes)
