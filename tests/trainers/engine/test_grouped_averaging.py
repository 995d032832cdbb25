"""Grouped averaging (:class:`trainers.api.Aggregation`'s ``groups``, the fed server's :class:`Groups`): the devices of
each group are averaged apart into that group's global model, which only its members download — FedConcat's
clusters (Diao, Li & He, AAAI 2024; its authors' ``experiments.py``, ``--alg fedconcat``, the encoder rounds).

The reference is FedAvg with client sampling written out with plain SGD (tests/federated_reference.py), its
averages taken per group: every I rounds the participants of each group are averaged (|𝒟_i|-weighted, eq. 7) into
that group's global model, which they load; a device drawn after missing its group's last average loads it first
(one that no average of its group has reached keeps w⁰).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.engine_builders import flat, make_data, small_model
from tests.federated_reference import check_round, federated_reference
from trainers.api import Aggregation, RoundContext
from trainers.engine.split_engine import SplitEngine
from trainers.strategies.fedavg import FedAvg
from trainers.strategies.sfl import SFLV1

B, LR, N, RHO, ROUNDS = 16, 0.1, 6, 0.5, 6
GROUPS = (0, 1, 1, 0, 2, 1)
L = len(small_model())


class GroupedFedAvg(FedAvg):
    """FedAvg whose aggregation averages the groups of ``GROUPS`` apart."""

    def __init__(self, participation: float = RHO, recipients: str = "participants") -> None:
        super().__init__(participation)
        self.recipients = recipients

    def aggregation(self, ctx: RoundContext) -> Aggregation | None:
        return (Aggregation(tuple(range(ctx.num_blocks)), "data_size", None, self.recipients, GROUPS)
                if ctx.aggregation_due() else None)


def engine(interval: int, recipients: str = "participants") -> SplitEngine:
    return SplitEngine(small_model(), [L] * N, GroupedFedAvg(RHO, recipients), make_data(N, "dirichlet"), {"lr": LR},
                       batch_size=B, seed=0, interval=interval)


@pytest.mark.parametrize("recipients", ["participants", "all"])
@pytest.mark.parametrize("interval", [1, 2])
def test_each_group_is_fedavg_of_its_own_members(interval: int, recipients: str) -> None:
    """6 devices in 3 groups, ρ = 0.5, 6 rounds: every device's model and each group's evaluated global model equal
    the reference to 1e-6 (a group none of whose members has been averaged yet: w⁰); the draws left some group out of
    some average and brought a stale device back."""
    eng = engine(interval, recipients)
    reference = federated_reference(small_model(), make_data(N, "dirichlet"),
                                    lambda i, z, y: nn.functional.cross_entropy(z, y), ROUNDS, RHO, interval, LR, B,
                                    groups=GROUPS, recipients=recipients)
    left_out = 0
    for ref in reference:
        check_round(eng, ref)
        left_out += len(set(GROUPS) - {GROUPS[i] for i in ref.participants})
        for group in set(GROUPS):
            expected = flat(ref.group_models[group]) if group in ref.group_models else flat(small_model())
            assert torch.allclose(flat(eng.global_model(group)), expected, atol=1e-6, rtol=0), (ref.t, group)
    assert left_out > 0


@pytest.mark.parametrize("stop", [2, 3])
def test_a_grouped_run_resumes_from_its_checkpoint_with_every_groups_model(stop: int) -> None:
    """Stopped after round 2 (a period's end: late devices download their group's model before the next average) or
    3 (mid-period) and resumed in a fresh engine: the rounds after give the same models and group models as a
    straight run (the fed server's groups and its other groups' global blocks are in the checkpoint)."""
    straight, resumed = engine(2), engine(2)
    for t in range(1, stop + 1):
        straight.run_round(t)
        resumed.run_round(t)
    state = resumed.state_dict()
    assert state["fed"]["groups"] == list(GROUPS) and set(state["fed"]["group_blocks"]) <= {1, 2}
    again = engine(2)
    again.load_state_dict(state)
    for t in range(stop + 1, 7):
        assert straight.run_round(t).loss == again.run_round(t).loss
    for i in range(N):
        assert flat(straight.device_model(i)).equal(flat(again.device_model(i)))
    for group in set(GROUPS):
        assert flat(straight.global_model(group)).equal(flat(again.global_model(group)))


@pytest.mark.parametrize(("change", "message"), [
    (lambda fed: fed.update(groups=[0] * (N - 1)), "one integer group ≥ 0 per device"),
    (lambda fed: fed.update(groups=[0, -1, 1, 1, 2, 1]), "one integer group ≥ 0 per device"),
    (lambda fed: fed.pop("group_blocks"), "or with \\['group_blocks', 'groups'\\]"),
    (lambda fed: fed.update(group_blocks={7: {}}), "keyed by groups of the devices after group 0 \\(\\[1, 2\\]\\)"),
])
def test_a_checkpoint_with_wrong_groups_is_refused_naming_them(change, message) -> None:
    eng = engine(1)
    eng.run_round(1)
    state = eng.state_dict()
    change(state["fed"])
    with pytest.raises(ValueError, match=message):
        engine(1).load_state_dict(state)


def test_groups_must_name_every_device_and_cover_client_blocks_only() -> None:
    class Short(GroupedFedAvg):
        def aggregation(self, ctx: RoundContext) -> Aggregation | None:
            return Aggregation(tuple(range(ctx.num_blocks)), groups=GROUPS[:-1])

    class OnTheEdge(SFLV1):
        def aggregation(self, ctx: RoundContext) -> Aggregation | None:
            return Aggregation(tuple(range(ctx.num_blocks)), groups=GROUPS)

    short = SplitEngine(small_model(), [L] * N, Short(), make_data(N), {"lr": LR}, batch_size=B, seed=0)
    with pytest.raises(ValueError, match="names 5 groups for 6 devices"):
        short.run_round(1)
    edge = SplitEngine(small_model(), [4] * N, OnTheEdge(participation=1.0), make_data(N), {"lr": LR}, batch_size=B,
                       seed=0)
    with pytest.raises(ValueError, match="client blocks only; block 4 is on the edge server"):
        edge.run_round(1)
