"""Optimizers per role (trainers/roles/optim.py): the default, scaling, clipping, the SGD and Adam rules
written out, and optimizer state moved as copies."""

from __future__ import annotations

import torch
from torch import nn

from trainers.roles.optim import OptimizerSpec

torch.set_num_threads(1)


# ---- optimizers by hand ----------------------------------------------------------------------------------------
def param(*values: float) -> nn.Parameter:
    return nn.Parameter(torch.tensor(values, dtype=torch.float64))


def step(opt, p: nn.Parameter, grad, scale: float = 1.0) -> None:
    p.grad = torch.tensor(grad, dtype=torch.float64)
    opt.step(scale)


def test_default_optimizer_is_plain_sgd_at_lr_0_01() -> None:
    from trainers.roles.optim import RoleOptimizer

    p = param(1.0, -2.0)
    opt = RoleOptimizer(OptimizerSpec(), [p])
    step(opt, p, [10.0, 20.0])
    assert torch.allclose(p.detach(), torch.tensor([1.0 - 0.1, -2.0 - 0.2], dtype=torch.float64))
    assert p.grad is None                                              # cleared after the step
    step(opt, p, [10.0, 0.0])                                          # no momentum: the same rule again
    assert torch.allclose(p.detach(), torch.tensor([0.8, -2.2], dtype=torch.float64))


def test_scaling_then_clipping_then_the_sgd_rule_with_momentum_and_weight_decay() -> None:
    from trainers.roles.optim import RoleOptimizer

    p = param(3.0, 4.0)
    opt = RoleOptimizer(OptimizerSpec("sgd", lr=0.5, clip_norm=1.0), [p])
    step(opt, p, [3.0, 4.0], scale=2.0)          # 2·(3, 4) = (6, 8), norm 10 → clipped to norm 1: (0.6, 0.8)
    assert torch.allclose(p.detach(), torch.tensor([3.0 - 0.3, 4.0 - 0.4], dtype=torch.float64))
    q = param(1.0)
    opt = RoleOptimizer(OptimizerSpec("sgd", lr=0.1, momentum=0.9, weight_decay=0.5), [q])
    step(opt, q, [2.0])                          # g' = 2 + 0.5·1 = 2.5, buf = 2.5, q = 1 − 0.25 = 0.75
    assert torch.allclose(q.detach(), torch.tensor([0.75], dtype=torch.float64))
    step(opt, q, [0.0], scale=3.0)               # g' = 0 + 0.5·0.75 = 0.375, buf = 0.9·2.5 + 0.375 = 2.625
    assert torch.allclose(q.detach(), torch.tensor([0.75 - 0.2625], dtype=torch.float64))
    (state,) = opt.param_states([q])
    assert torch.allclose(state["momentum_buffer"], torch.tensor([2.625], dtype=torch.float64))


def test_adam_is_adam_and_a_step_without_gradients_changes_nothing() -> None:
    from trainers.roles.optim import RoleOptimizer

    p = param(1.0, 1.0)
    opt = RoleOptimizer(OptimizerSpec("adam", lr=0.1), [p])
    opt.step()                                                         # no gradient yet: no step, no state
    assert opt.param_states([p]) == [{}] and torch.equal(p.detach(), torch.ones(2, dtype=torch.float64))
    step(opt, p, [4.0, -0.5])                    # Adam's first step: lr·m̂/(√v̂ + ε) = lr·sign(g)
    assert torch.allclose(p.detach(), torch.tensor([0.9, 1.1], dtype=torch.float64), atol=1e-6)
    assert RoleOptimizer(OptimizerSpec(), []).torch is None            # an owner without parameters
    RoleOptimizer(OptimizerSpec(), []).step()


def test_optimizer_states_move_as_copies() -> None:
    from trainers.roles.optim import RoleOptimizer

    p, q = param(1.0), param(1.0)
    a = RoleOptimizer(OptimizerSpec("sgd", lr=0.1, momentum=0.9), [p])
    step(a, p, [1.0])
    b = RoleOptimizer(OptimizerSpec("sgd", lr=0.1, momentum=0.9), [q])
    b.load_param_states([q], a.param_states([p]))
    step(a, p, [1.0])
    step(b, q, [1.0])
    # a: buf 1 → 1.9, p = 0.9 − 0.19; b continues from a copy of buf = 1 (a's second step does not touch it)
    assert torch.allclose(p.detach(), torch.tensor([0.71], dtype=torch.float64))
    assert torch.allclose(q.detach(), torch.tensor([1.0 - 0.19], dtype=torch.float64))


def test_a_resumed_optimizers_numbers_must_be_the_runs_own() -> None:
    """check_optimizer_state (a checkpoint's optimizer): the learning rate and momentum are the run's configuration's,
    which nothing changes during a run; another value (−1 trains uphill), NaN, a flag, an integer of 400 digits
    (beyond a float: math.isfinite raised OverflowError) is refused as a ValueError naming the expected value."""
    import math

    import pytest

    from trainers.roles.optim import check_optimizer_state

    params = [nn.Parameter(torch.zeros(2))]
    mine = torch.optim.SGD(params, lr=0.1, momentum=0.9).state_dict()
    adam = torch.optim.Adam(params, lr=0.1).state_dict()

    def group(ref: dict, **change: object) -> dict:
        return {"state": {}, "param_groups": [dict(ref["param_groups"][0], **change)]}

    check_optimizer_state(group(mine), mine, params)
    check_optimizer_state(group(adam, betas=list(adam["param_groups"][0]["betas"])), adam, params)   # a list: JSON's
    for change in ({"lr": -1}, {"lr": math.nextafter(0.1, 1)}, {"lr": 10 ** 400}, {"lr": math.nan}, {"lr": True},
                   {"momentum": 0.0}):
        (key, value), = change.items()
        with pytest.raises(ValueError, match=rf"^optimizer {key} must be {mine['param_groups'][0][key]!r}, as the "
                                             "run's configuration sets it, got "):
            check_optimizer_state(group(mine, **change), mine, params)
    for betas in ((0.9, 0.99), (0.9,), (True, 0.999), "x"):
        with pytest.raises(ValueError, match=r"^optimizer betas must be \(0\.9, 0\.999\), as the run's"):
            check_optimizer_state(group(adam, betas=betas), adam, params)
    stepped = {"state": {0: {"step": -1, "exp_avg": torch.zeros(2), "exp_avg_sq": torch.zeros(2)}},
               "param_groups": adam["param_groups"]}
    with pytest.raises(ValueError, match=r"^optimizer state step of parameter 0 must be a tensor or a number, got -1"):
        check_optimizer_state(stepped, adam, params)
    for count in (3, 0):                                                        # older torch's count, from 0
        stepped["state"][0]["step"] = count
        check_optimizer_state(stepped, adam, params)
    for buffer in (torch.tensor([0.0, math.nan]), torch.tensor([1, 2]), torch.zeros(3)):  # one NaN, ints, a shape
        with pytest.raises(ValueError, match=r"^optimizer state momentum_buffer of parameter 0 must be a finite float "):
            check_optimizer_state({"state": {0: {"momentum_buffer": buffer}}, "param_groups": mine["param_groups"]},
                                  mine, params)


def test_an_optimizer_states_structure_is_refused_naming_what_is_wrong() -> None:
    """check_optimizer_state's structural rules, each with its message (the resume tests of test_checkpoint.py reach
    them through a whole run)."""
    import pytest

    from trainers.roles.optim import check_optimizer_state

    params = [nn.Parameter(torch.zeros(2))]
    mine = torch.optim.SGD(params, lr=0.1, momentum=0.9).state_dict()
    group = mine["param_groups"][0]
    cases = [({"state": {}}, "an optimizer state must hold exactly 'state' and 'param_groups'"),
             ([], "an optimizer state must hold exactly 'state' and 'param_groups'"),
             ({"state": {}, "param_groups": []}, "an optimizer state must hold 1 parameter group(s)"),
             ({"state": {}, "param_groups": {}}, "an optimizer state must hold 1 parameter group(s)"),
             ({"state": {}, "param_groups": [{k: v for k, v in group.items() if k != "dampening"}]},
              "an optimizer parameter group must hold ['dampening', 'lr', 'momentum', 'params', 'weight_decay']"),
             ({"state": {}, "param_groups": ["x"]}, "an optimizer parameter group must hold"),
             ({"state": {}, "param_groups": [dict(group, nesterov=True)]}, "optimizer nesterov must be False, got True"),
             ({"state": {1: {}}, "param_groups": [group]}, "an optimizer state's entries must be for its parameters 0..0"),
             ({"state": [], "param_groups": [group]}, "an optimizer state's entries must be for its parameters 0..0"),
             ({"state": {0: 1.5}, "param_groups": [group]}, "optimizer state of parameter 0 must be an object")]
    for state, message in cases:
        with pytest.raises(ValueError) as caught:
            check_optimizer_state(state, mine, params)
        assert str(caught.value).startswith(message), (state, str(caught.value))
    bare = {k: v for k, v in group.items() if k in ("params", "lr", "momentum", "dampening", "weight_decay")}
    check_optimizer_state({"state": {}, "param_groups": [bare]}, mine, params)   # every flag absent: torch sets them
    adam = torch.optim.Adam(params, lr=0.1).state_dict()
    without_betas = {k: v for k, v in adam["param_groups"][0].items() if k != "betas"}
    with pytest.raises(ValueError, match=r"^an optimizer parameter group must hold \['betas', "):
        check_optimizer_state({"state": {}, "param_groups": [without_betas]}, adam, params)   # a tuple is a number too
