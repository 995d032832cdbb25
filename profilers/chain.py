"""The model as a chain of blocks between consecutive cut points (docs/model.md §9 "Cut points").

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

import math
import warnings
from dataclasses import dataclass, field

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from adaptplan.errors import InputError
from profilers.cutpoints import assertion_nodes, choose_cuts, cut_names, input_node, is_anchor_module, node_shape, values_per_sample
from profilers.input_shapes import channels_last_hint
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
            to its children, parameter-free children joining a neighbouring layer by the same rule.
            ``"children"`` takes an ``nn.Sequential``'s children as
            the blocks as they are (no tracing), for users who chunk the model themselves.

    Raises:
        InputError: untraceable model (naming the module/op), several inputs or outputs, or a
            parameterised module used in two blocks.

    Warns:
        NoCutWarning: the model has no cut point but its output (L = 1).
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
            return _sequential_chain(model, example_input, merge=True)
        raise
    gm.graph.eliminate_dead_code()
    _propagate_shapes(gm, example_input)
    cuts = _drop_zero_flop_cuts(gm, choose_cuts(gm).cuts, example_input)
    sequence = nn.Sequential(*_split(gm, cuts))
    _check_parameters_owned_once(sequence)
    chain = Chain(blocks=sequence, names=cut_names(gm.graph, cuts), output_shapes=[node_shape(c) for c in cuts])
    warn_if_unsplittable(chain, type(model).__name__)
    return chain


class NoCutWarning(UserWarning):
    """The model has no cut point but its output: it cannot be split between device and server."""


def warn_if_unsplittable(chain: Chain, model_name: str) -> None:
    """Warn when ``chain`` has a single block (L = 1): no cut but the model output."""
    if len(chain) == 1:
        warnings.warn(
            f"{model_name} has no cut point but its output (L = 1): it has one parametrised layer, or no "
            "single tensor crosses between its layers (a skip connection around all of them), so it cannot be "
            "split between a device and the server and cannot be planned. Fix: for your own model, wrap it as "
            "an nn.Sequential of the blocks you want and use blocks='children'",
            NoCutWarning, stacklevel=3,
        )


def _propagate_shapes(gm: fx.GraphModule, example_input: torch.Tensor) -> None:
    """Shape metadata on every node. The model is first run plainly, so that a wrong input shape
    is one InputError with torch's own message (ShapeProp would print a traceback first)."""
    was_training = gm.training
    gm.eval()
    try:
        with torch.no_grad():
            try:
                gm(example_input)
            except Exception as exc:
                raise InputError(shape_failure(example_input, exc), field="input_shape") from None
            ShapeProp(gm).propagate(example_input)
    finally:
        gm.train(was_training)


def shape_failure(example_input: torch.Tensor, exc: Exception) -> str:
    """The message for a model that fails on ``example_input``, with a hint for channels-last shapes."""
    shape = tuple(example_input.shape[1:])
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    hint = channels_last_hint(shape) or "check the input shape (channels × height × width)"
    return (f"the model cannot run on samples of shape {'x'.join(map(str, shape))} (the --input given, or the "
            f"dataset's samples): {type(exc).__name__}: {first_line}. Fix: {hint}")


def _drop_zero_flop_cuts(gm: fx.GraphModule, cuts: list[fx.Node], example_input: torch.Tensor) -> list[fx.Node]:
    """``cuts`` without duplicates: where a block j ≥ 2 has zero forward FLOPs (a class token
    concatenated, a position embedding added), cuts j−1 and j cost the device the same FLOPs, so
    only the one with fewer values per sample is kept (ties: the earlier, which holds fewer
    parameters). The output cut is always kept. FLOPs by FlopCounterMode on ``example_input``, with the
    profile's own formulas (an LSTM's CPU kernel among them)."""
    from torch.utils.flop_counter import FlopCounterMode

    from profilers.flops import CUSTOM_FORMULAS

    flops = []
    was_training = gm.training
    gm.eval()
    try:
        x = example_input
        for block in _split(gm, cuts):
            with FlopCounterMode(display=False, custom_mapping=CUSTOM_FORMULAS) as counter:
                x = block(x)
            flops.append(counter.get_total_flops())
    finally:
        gm.train(was_training)
    kept = [cuts[0]]
    for cut, block_flops in zip(cuts[1:], flops[1:]):
        if block_flops > 0:
            kept.append(cut)
        elif cut is cuts[-1] or values_per_sample(cut) < values_per_sample(kept[-1]):
            kept[-1] = cut
    return kept


def _split(gm: fx.GraphModule, cuts: list[fx.Node]) -> list[fx.GraphModule]:
    """One ``GraphModule`` per span (previous cut, cut]; the first span starts at the input."""
    order = {node: k for k, node in enumerate(gm.graph.nodes)}
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]
    checks = assertion_nodes(gm.graph)
    blocks = []
    previous = input_node(gm.graph)
    for j, cut in enumerate(cuts, start=1):
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {previous: graph.placeholder("x")}
        for node in nodes:
            if not order[previous] < order[node] <= order[cut]:
                continue
            if node in checks and any(src not in env for src in node.all_input_nodes if src.op != "get_attr"):
                continue  # a run-time check on a value of an earlier block: dropped, it is no dataflow
            for source in node.all_input_nodes:
                if source not in env:
                    if source.op != "get_attr":  # cannot happen for a single-tensor cut
                        raise AssertionError(f"value {source.name} crosses cut {previous.name}")
                    env[source] = graph.node_copy(source)
            env[node] = graph.node_copy(node, env.__getitem__)
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


def _sequential_chain(model: nn.Sequential, example_input: torch.Tensor, merge: bool = False) -> Chain:
    """The children of an ``nn.Sequential`` as the blocks.

    With ``merge`` (the fallback for a Sequential fx cannot trace) the rule of
    :func:`profilers.cutpoints.choose_cuts` is applied to the children: between two consecutive
    children with parameters (normalisation layers excluded) one cut, after the child with the
    fewest values per sample (ties: the later one), so ReLU, pooling and flatten join a layer
    instead of making zero-FLOP cut points of their own; the last cut is the output.
    """
    if len(model) == 0:
        raise InputError("the nn.Sequential has no children", field="model")
    children = list(model._modules.items())  # not named_children(): it skips a module that appears twice
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
    ends = _merged_ends(children, shapes) if merge else list(range(len(children)))
    groups, start = [], 0
    for end in ends:
        group = [child for _, child in children[start:end + 1]]
        groups.append(group[0] if len(group) == 1 else nn.Sequential(*group))
        start = end + 1
    blocks = nn.Sequential(*groups)
    _check_parameters_owned_once(blocks)
    chain = Chain(blocks=blocks, names=[children[e][0] for e in ends], output_shapes=[shapes[e] for e in ends])
    if merge:
        warn_if_unsplittable(chain, type(model).__name__)
    return chain


def _merged_ends(children: list[tuple[str, nn.Module]], shapes: list[tuple[int, ...]]) -> list[int]:
    """Index of the last child of each merged block (see :func:`_sequential_chain`)."""
    anchors = [k for k, (_, child) in enumerate(children) if is_anchor_module(child)]
    ends = []
    for start, stop in zip(anchors, anchors[1:]):
        ends.append(max(range(start, stop), key=lambda k: (-math.prod(shapes[k]), k)))
    if not ends or ends[-1] != len(children) - 1:
        ends.append(len(children) - 1)
    return ends
