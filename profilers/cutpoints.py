"""Cut-point discovery on a torch.fx graph (docs/model.md §9 "Cut points").

Two steps:

1. **Single-tensor positions** (:func:`single_tensor_positions`). The fx graph becomes a networkx
   dataflow DAG (one vertex per value-producing node; ``get_attr`` constants are left out because
   every block can re-read them). A node ``v`` is a single-tensor position iff

   * ``v`` dominates the output, i.e. every input→output path passes through ``v``
     (``networkx.immediate_dominators`` from the input), and
   * the cut carries only ``v``: with ``A = ancestors(v) ∪ {v}``, the only vertex of ``A`` with a
     user outside ``A`` is ``v`` itself (no earlier value is used after ``v``), and
   * ``v`` produces a tensor.

   Run-time checks are not dataflow: a ``torch._assert`` (every torchvision ViT checks its input
   size and each encoder block's rank this way) and the values only it uses (``x.shape``, ``==``)
   are left out of the DAG (:func:`assertion_nodes`). Kept in, they would make the input's
   shape cross every later position, leaving the model without a single cut point.

   Inside a residual block the skip connection keeps the block input alive until the ``add``, so
   no interior node qualifies: ResNets are only ever cut between blocks.

2. **Chosen cut points** (:func:`choose_cuts`). Not every single-tensor position is a meaningful
   cut (a ReLU or a dropout right after a conv would make a parameter-free block). The rule:

   * an **anchor** is a node that applies parameters: a leaf module call with parameters, other
     than a normalisation layer (BatchNorm/InstanceNorm/LayerNorm/GroupNorm belong to the layer
     they normalise), or a function call that reads a parameter through ``get_attr``;
   * between two consecutive anchors a_k and a_{k+1} (positions a_k ≤ p < a_{k+1}) at most one cut
     is chosen: the single-tensor position with the **fewest values per sample** crossing it,
     ties going to the **latest** one. Every candidate in that window has the same client
     parameters, so this is the Pareto-best cut there: activation functions, dropout and
     size-reducing pooling join the layer they follow; size-increasing ops (e.g. VGG's
     ``AdaptiveAvgPool2d(7)`` on a 1×1 map) join the next layer;
   * windows without a single-tensor position (inside residual blocks) get no cut;
   * the last cut point j = L is always the model output.

   Consequences: VGG-16 gets one cut per conv/linear layer (L = 16, as in the paper); ResNet-18
   gets the stem, each BasicBlock and the classifier (L = 10).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import torch
from torch import fx, nn

from adaptplan.errors import InputError

NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,  # BatchNorm*d, InstanceNorm*d, SyncBatchNorm
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
)


@dataclass(frozen=True)
class GraphCuts:
    """The result of the analysis: chosen cut nodes (j = 1..L) and all single-tensor positions."""

    cuts: list[fx.Node]
    candidates: list[fx.Node]


ASSERT_FUNCTIONS = (torch._assert, torch._assert_async)


def assertion_nodes(graph: fx.Graph) -> set[fx.Node]:
    """Run-time checks: calls of ``torch._assert`` and every node whose users are all such checks."""
    checks = {n for n in graph.nodes if n.op == "call_function" and n.target in ASSERT_FUNCTIONS}
    for node in reversed(graph.nodes):  # users come after their inputs
        if node.op not in ("placeholder", "output") and node.users and all(u in checks for u in node.users):
            checks.add(node)
    return checks


def dataflow_graph(graph: fx.Graph) -> nx.DiGraph:
    """The dataflow DAG of ``graph``: an edge u → v when node v uses the value of node u.

    ``get_attr`` nodes (parameters, buffers, constants), the ``output`` node and run-time checks
    (:func:`assertion_nodes`) are excluded.
    """
    skip = assertion_nodes(graph)
    dag = nx.DiGraph()
    for node in graph.nodes:
        if node.op in ("get_attr", "output") or node in skip:
            continue
        dag.add_node(node)
        for source in node.all_input_nodes:
            if source.op != "get_attr":
                dag.add_edge(source, node)
    return dag


def output_value(graph: fx.Graph) -> fx.Node:
    """The node whose value the model returns; a model must return a single tensor."""
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    value = out.args[0]
    if not isinstance(value, fx.Node):
        raise InputError(
            f"the model returns {type(value).__name__}, but a split model needs a single output tensor. "
            "Fix: wrap the model so that forward returns one tensor",
            field="model",
        )
    return value


def input_node(graph: fx.Graph) -> fx.Node:
    """The single ``placeholder`` of ``graph``; more than one input cannot be split into a chain."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise InputError(
            f"forward takes {len(placeholders)} inputs ({', '.join(n.name for n in placeholders)}); "
            "split learning needs exactly one input tensor. Fix: wrap the model with a one-argument forward",
            field="model",
        )
    return placeholders[0]


def _is_tensor(node: fx.Node) -> bool:
    meta = node.meta.get("tensor_meta")
    return meta is not None and hasattr(meta, "shape")


def single_tensor_positions(graph: fx.Graph) -> list[fx.Node]:
    """All nodes after which exactly one tensor (their own value) crosses, in graph order.

    Needs ``tensor_meta`` from ``torch.fx.passes.shape_prop.ShapeProp``. See the module docstring.
    """
    dag = dataflow_graph(graph)
    source, sink = input_node(graph), output_value(graph)
    idom = nx.immediate_dominators(dag, source)
    if sink not in idom:
        raise InputError("the model output does not depend on its input", field="model")
    dominators = [sink]
    while dominators[-1] is not source:
        dominators.append(idom[dominators[-1]])
    positions = []
    for v in reversed(dominators[:-1]):  # graph order, input excluded
        upstream = nx.ancestors(dag, v) | {v}
        crossing = {u for u in upstream if any(w not in upstream for w in dag.successors(u))}
        if crossing <= {v} and _is_tensor(v):
            positions.append(v)
    return positions


def is_anchor_module(module: nn.Module) -> bool:
    """True iff ``module`` has parameters and is not a normalisation layer."""
    return not isinstance(module, NORM_TYPES) and any(True for _ in module.parameters())


def is_anchor(node: fx.Node, root: nn.Module) -> bool:
    """True iff ``node`` applies parameters (see the module docstring); normalisation is not an anchor."""
    if node.op == "call_module":
        return is_anchor_module(root.get_submodule(str(node.target)))
    if node.op in ("call_function", "call_method"):
        for source in node.all_input_nodes:
            if source.op == "get_attr" and isinstance(_attr(root, str(source.target)), nn.Parameter):
                return True
    return False


def _attr(root: nn.Module, target: str) -> object:
    obj: object = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def values_per_sample(node: fx.Node) -> int:
    """numel of the node's tensor for one sample (batch dimension dropped)."""
    shape = tuple(node.meta["tensor_meta"].shape)
    count = 1
    for size in shape[1:]:
        count *= int(size)
    return count


def choose_cuts(gm: fx.GraphModule) -> GraphCuts:
    """Choose the cut points j = 1..L of ``gm`` (shape-propagated) by the rule of the module docstring."""
    graph = gm.graph
    order = {node: k for k, node in enumerate(graph.nodes)}
    candidates = single_tensor_positions(graph)
    sink = output_value(graph)
    anchors = [order[n] for n in graph.nodes if is_anchor(n, gm)]
    cuts: list[fx.Node] = []
    for start, stop in zip(anchors, anchors[1:]):
        window = [c for c in candidates if start <= order[c] < stop]
        if window:
            # fewest values per sample; ties → latest (max of (−size, position))
            cuts.append(max(window, key=lambda c: (-values_per_sample(c), order[c])))
    if not cuts or cuts[-1] is not sink:
        cuts.append(sink)
    return GraphCuts(cuts=cuts, candidates=candidates)


def cut_names(graph: fx.Graph, cuts: list[fx.Node]) -> list[str]:
    """A readable name per cut: among the modules that lie wholly inside the block, the one that
    ends last (outermost on ties), e.g. ``layer1.0`` for a ResNet's first BasicBlock,
    ``features.4`` for VGG's first pooling layer, ``conv1`` for ``torch.relu(self.conv1(x))``;
    else the fx node name. An ``nn.Identity`` (a layer taken out, e.g. resnet18-cifar's max-pool) names
    nothing; a module known only by its ``nn.Sequential`` index gets its class too (``2:MaxPool2d``,
    ``9.0:Conv2d``). Names are unique."""
    order = {node: k for k, node in enumerate(graph.nodes)}
    span: dict[str, list[int]] = {}
    kind: dict[str, type] = {}
    for node in graph.nodes:
        for path, entry in node.meta.get("nn_module_stack", {}).items():
            span.setdefault(str(path), [order[node], order[node]])[1] = order[node]
            if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], type):
                kind[str(path)] = entry[1]
    names: list[str] = []
    start = 0
    for node in cuts:
        inside = [(last, -first, path) for path, (first, last) in span.items()
                  if start < first and last <= order[node] and kind.get(path) is not nn.Identity]
        name = _readable(max(inside)[2], kind) if inside else node.name
        names.append(node.name if name in names else name)
        start = order[node]
    return names


def _readable(path: str, kind: dict[str, type]) -> str:
    """``path``, with its module's class where the path is only ``nn.Sequential`` indices (``9.0`` → ``9.0:Conv2d``)."""
    if all(part.isdigit() for part in path.split(".")) and path in kind:
        return f"{path}:{kind[path].__name__}"
    return path


def node_shape(node: fx.Node) -> tuple[int, ...]:
    """Per-sample shape of the node's tensor (batch dimension dropped)."""
    return tuple(int(s) for s in node.meta["tensor_meta"].shape[1:])
