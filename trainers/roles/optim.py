"""Optimizers per role: what a strategy asks for (:class:`OptimizerSpec`) and the object a role
steps (:class:`RoleOptimizer`: a torch optimizer plus optional gradient-norm clipping).

SGD (momentum, weight decay) is AdaptSFL's and SplitFed's; Adam is CycleSL's (docs/algorithms.md
CycleSL A.4.3); SCALA and GAS clip the gradient norm at 10 (docs/algorithms.md SCALA B.4, GAS B.4.5).
Optimizer state persists across steps and rounds and moves with a block when it changes role.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from adaptplan.fileio import is_finite_number, is_number
from trainers.config.optimizer_spec import OPTIMIZERS, OptimizerSpec  # noqa: F401  (re-exported: the spec is torch-free)


class RoleOptimizer:
    """The optimizer of one owner (a device's client part, or one edge-server instance group)."""

    def __init__(self, spec: OptimizerSpec, params: Iterable[nn.Parameter]) -> None:
        self.spec = spec
        self.params = list(params)
        self.torch = spec.build(self.params) if self.params else None
        self.anchors: list[torch.Tensor] | None = [p.detach().clone() for p in self.params] \
            if spec.proximal_mu else None
        """FedProx's w_anchor per parameter (``spec.proximal_mu`` > 0): the weights at construction, then at every
        :meth:`reanchor`."""

    def reanchor(self, params: Iterable[nn.Parameter]) -> None:
        """Take ``params``' current values as their proximal anchor (a download of the global model)."""
        if self.anchors is None:
            return
        index = {id(p): k for k, p in enumerate(self.params)}
        for p in params:
            self.anchors[index[id(p)]] = p.detach().clone()

    def load_anchors(self, anchors: object, where: str) -> None:
        """Restore :attr:`anchors` from a checkpoint (ValueError naming ``where`` unless one finite float tensor of
        each parameter's shape)."""
        if self.anchors is None:
            return
        if not isinstance(anchors, list) or len(anchors) != len(self.params) or not all(
                torch.is_tensor(a) and a.shape == p.shape and a.is_floating_point() and bool(torch.isfinite(a).all())
                for a, p in zip(anchors, self.params)):
            raise ValueError(f"{where} must hold the proximal anchor: one finite tensor of each parameter's shape")
        self.anchors = [a.detach().clone().to(p.dtype) for a, p in zip(anchors, self.params)]

    def step(self, scale: float = 1.0) -> None:
        """Multiply the gradients by ``scale``, add the proximal term's μ(w − w_anchor) (FedProx), clip (if asked),
        step, clear the gradients."""
        if self.torch is None:
            return
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        if scale != 1.0:
            torch._foreach_mul_(grads, scale)
        if self.anchors is not None:
            for p, anchor in zip(self.params, self.anchors):
                if p.grad is not None:
                    p.grad.add_(p.detach() - anchor, alpha=self.spec.proximal_mu)
        if self.spec.clip_norm is not None:
            nn.utils.clip_grad_norm_(self.params, self.spec.clip_norm)
        self.torch.step()
        self.torch.zero_grad(set_to_none=True)

    def zero_grad(self) -> None:
        if self.torch is not None:
            self.torch.zero_grad(set_to_none=True)

    def reset(self, params: Iterable[nn.Parameter]) -> None:
        """Forget the optimizer state of ``params`` (their next step starts as a first step)."""
        if self.torch is not None:
            for p in params:
                self.torch.state.pop(p, None)

    def param_states(self, params: Iterable[nn.Parameter]) -> list[dict[str, Any]]:
        """The optimizer state of each of ``params`` (empty dict where none yet)."""
        state = self.torch.state if self.torch is not None else {}
        return [dict(state.get(p, {})) for p in params]

    def load_param_states(self, params: Iterable[nn.Parameter], states: Iterable[dict[str, Any]]) -> None:
        if self.torch is None:
            return
        for p, s in zip(params, states):
            if s:
                self.torch.state[p] = {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}

    def state_dict(self) -> dict[str, Any]:
        return self.torch.state_dict() if self.torch is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`, checked first (:func:`check_optimizer_state`: ValueError naming what does
        not fit), so that a bad checkpoint is refused when it is loaded, not met as an error rounds later."""
        if self.torch is None:
            if state:
                raise ValueError("holds an optimizer state for a part without parameters")
            return
        check_optimizer_state(state, self.torch.state_dict(), self.params)
        self.torch.load_state_dict(state)


def check_optimizer_state(state: Any, mine: dict[str, Any], params: list[nn.Parameter]) -> None:
    """ValueError unless ``state`` is a state of this optimizer (``mine``, its own state_dict, over ``params``): the
    same parameter groups, their keys among its own (``params`` and every number its step reads at least), numbers where it
    has numbers, equal to its own (the run's configuration sets the learning rate and the rest, and nothing changes
    them during a run), the same flags; per-parameter entries only for its parameters, each tensor of
    the parameter's shape (a step count a scalar) and finite."""
    if not isinstance(state, dict) or set(state) != {"state", "param_groups"}:
        raise ValueError("an optimizer state must hold exactly 'state' and 'param_groups'")
    groups, own = state["param_groups"], mine["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(own):
        raise ValueError(f"an optimizer state must hold {len(own)} parameter group(s)")
    for group, ref in zip(groups, own):
        needed = {"params", "lr"} | {k for k, v in ref.items() if is_number(v) or isinstance(v, (tuple, list))}
        # another torch may lack flags (its __setstate__ sets them), never a number the step reads
        if not isinstance(group, dict) or not needed <= set(group) <= set(ref):
            raise ValueError(f"an optimizer parameter group must hold {sorted(needed)} and only keys of {sorted(ref)}")
        for key, value in group.items():
            expected = ref[key]
            if key == "params" or isinstance(expected, (bool, str)) or expected is None:
                if value != expected:
                    raise ValueError(f"optimizer {key} must be {expected!r}, got {str(value)[:60]}")
            elif isinstance(expected, (tuple, list)):
                if not (isinstance(value, (tuple, list)) and all(map(is_number, value)) and list(value) == list(expected)):
                    raise ValueError(f"optimizer {key} must be {expected!r}, as the run's configuration sets it, got "
                                     f"{str(value)[:60]}")
            elif not is_number(value) or value != expected:
                raise ValueError(f"optimizer {key} must be {expected!r}, as the run's configuration sets it, got "
                                 f"{str(value)[:60]}")
    shapes = dict(enumerate(p.shape for p in params))
    entries = state["state"]
    if not isinstance(entries, dict) or not set(entries) <= set(shapes):
        raise ValueError(f"an optimizer state's entries must be for its parameters 0..{len(shapes) - 1}")
    for index, entry in entries.items():
        if not isinstance(entry, dict):
            raise ValueError(f"optimizer state of parameter {index} must be an object")
        for key, value in entry.items():
            if not torch.is_tensor(value):
                if key != "step" or not is_finite_number(value) or value < 0:   # (a number in older torch)
                    raise ValueError(f"optimizer state {key} of parameter {index} must be a tensor"
                                     f"{' or a number' if key == 'step' else ''}, got {str(value)[:60]}")
                continue
            wanted = torch.Size([]) if key == "step" else shapes[index]
            if value.shape != wanted or not (value.is_floating_point() and bool(torch.isfinite(value).all())):
                raise ValueError(f"optimizer state {key} of parameter {index} must be a finite float tensor of shape "
                                 f"{list(wanted)}, got {value.dtype} {list(value.shape)}")


def mean_param_state(states: list[dict[str, Any]]) -> dict[str, Any]:
    """Average optimizer states of one parameter (float tensors averaged, the rest from the first)."""
    states = [s for s in states if s]
    if not states:
        return {}
    if len(states) == 1:
        return {k: v.clone() if torch.is_tensor(v) else v for k, v in states[0].items()}
    merged = {}
    for k, v in states[0].items():
        if torch.is_tensor(v) and v.is_floating_point() and v.dim() > 0 and all(k in s for s in states):
            merged[k] = torch.stack([s[k] for s in states]).mean(0)
        else:
            merged[k] = v.clone() if torch.is_tensor(v) else v
    return merged
