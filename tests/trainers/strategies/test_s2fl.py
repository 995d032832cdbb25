"""S²FL (trainers/strategies/s2fl.py) against GAS's authors' baseline/S2FL.py written out: its grouping search
transcribed line by line (``authors_group_data``), its round by tests/concatenated_reference.py (MiniBatch-SFL with
the server's gradient the mean of the label-balanced groups', each clipped), and its equality with MiniBatch-SFL at
one group."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

from tests.concatenated_reference import CUT, LR, B, N, reference_scala
from tests.engine_builders import flat, make_data, small_model
from tests.reference_optim import HandSGD
from trainers.algorithms import REGISTRY
from trainers.engine.split_engine import SplitEngine
from trainers.roles.optim import OptimizerSpec
from trainers.strategies import make_strategy
from trainers.strategies.s2fl import balanced_groups, group_distance


def authors_group_data(order: list[int], counts: list[dict[int, int]], num_groups: int, n: int) -> list[list[int]]:
    """baseline/S2FL.py's ``group_data`` and its two distance functions as the file has them (dict histograms, 100
    passes, the swap loop's ``break``s), with one change: the last group takes the remainder of an odd split."""
    def l2(group):
        total, pooled = 0, defaultdict(int)
        for idx in group:
            total += sum(counts[idx].values())
            for label, c in counts[idx].items():
                pooled[label] += c
        return np.sqrt(sum(((pooled[i] / total if total > 0 else 0) - 1 / n) ** 2 for i in range(n)))

    def average(groups):
        return sum(l2(g) for g in groups) / num_groups

    per = len(order) // num_groups
    groups = [order[i * per:(i + 1) * per] for i in range(num_groups)]
    groups[-1] = order[(num_groups - 1) * per:]
    for _ in range(100):
        for group_index, group in enumerate(groups):
            for client_index in list(group):
                best_groups, best = groups, average(groups)
                for other_group_index, other_group in enumerate(groups):
                    if other_group_index != group_index:
                        for other_client_index in list(other_group):
                            new_groups = [grp.copy() for grp in groups]
                            if client_index not in new_groups[group_index]:
                                break
                            new_groups[group_index].remove(client_index)
                            new_groups[other_group_index].remove(other_client_index)
                            new_groups[group_index].append(other_client_index)
                            new_groups[other_group_index].append(client_index)
                            distance = average(new_groups)
                            if distance < best:
                                best_groups, best = new_groups, distance
                if best_groups != groups:
                    groups = best_groups
                    break
    return groups


@pytest.mark.parametrize("seed", range(12))
def test_the_grouping_is_the_authors_search(seed: int) -> None:
    """Random label histograms (sparse, as under label skew), 4–11 participants, 2 or 3 groups: the authors' groups,
    their members in the same order (which decides later ties), and never farther from uniform than the initial
    split."""
    rng = np.random.default_rng(seed)
    n, M = int(rng.integers(4, 12)), 10
    G = 2 if seed % 3 else 3
    counts = [rng.integers(0, 30, M) * (rng.random(M) < 0.3) for _ in range(n)]
    for c in counts:
        c[rng.integers(M)] += 1                                                        # no empty device
    order = [int(d) for d in rng.permutation(n)]
    ours = balanced_groups(order, counts, G, M)
    theirs = authors_group_data(order, [{i: int(c[i]) for i in range(M) if c[i]} for c in counts], G, M)
    assert ours == theirs
    per = n // G
    initial = [order[g * per:(g + 1) * per] for g in range(G - 1)] + [order[(G - 1) * per:]]
    assert group_distance(counts, ours, M) <= group_distance(counts, initial, M)


def test_single_class_devices_pair_up_into_uniform_groups() -> None:
    """Ten devices each holding one class, two per class, ordered so that the first five hold classes 0–2 only: the
    known optimum is one device of each of five classes per group (distance √(5·(0.2 − 0.1)² + 5·0.1²) = √0.1)."""
    M = 10
    labels = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    counts = [np.eye(M, dtype=int)[c] * 10 for c in labels]
    groups = balanced_groups(list(range(10)), counts, 2, M)
    assert all(sorted(labels[d] for d in g) == [0, 1, 2, 3, 4] for g in groups)
    assert group_distance(counts, groups, M) == pytest.approx(np.sqrt(0.1), rel=1e-12)


def engine_for(name: str, options: dict, data, interval: int, optimizer=None) -> SplitEngine:
    return SplitEngine(small_model(), [CUT] * N, make_strategy(name, options), data,
                       optimizer or {"lr": LR, "momentum": 0.0}, batch_size=B, seed=0, interval=interval)


@pytest.mark.parametrize("momentum", [False, True])
def test_s2fl_round_by_round_against_the_reference(momentum: bool) -> None:
    """Four of six devices per global iteration in two groups; plain SGD, and SGD with momentum 0.9, weight decay and
    a clip of 0.5 that binds (so each group's gradient is clipped before the mean, not the mean after)."""
    data, interval, rho = make_data(N, "dirichlet"), 2, 0.65
    spec = OptimizerSpec("sgd", LR, 0.9, 5e-4, 0.5) if momentum else None
    engine = engine_for("s2fl", {"participation": rho}, data, interval, spec)
    hand = HandSGD(LR, 0.9, 5e-4, 0.5) if momentum else None
    label_counts = [np.bincount(data.y_train[torch.from_numpy(p)].numpy(), minlength=10) for p in data.parts]
    seen = []

    def groups(C: list[int]) -> list[list[int]]:
        seen.append((list(C), authors_group_data(list(C), [{i: int(c[i]) for i in range(10) if c[i]}
                                                           for c in label_counts], 2, 10)))
        return seen[-1][1]

    for t, C, _, clients, server, _, losses in reference_scala(data, 6, interval, rho, opt=hand, tau=0.0,
                                                                   server_groups=groups):
        stats = engine.run_round(t)
        assert stats.participants == C and len(C) == 4
        assert stats.loss == pytest.approx(sum(losses.values()) / len(losses), rel=1e-5), t
        assert torch.allclose(flat(*[engine.edge.instances[(None, j)] for j in range(CUT, 11)]), flat(server),
                              atol=1e-5, rtol=0), t
        for k in range(N):
            assert torch.allclose(flat(engine.devices[k].blocks), flat(clients[k]), atol=1e-5, rtol=0), (t, k)
    assert any(g != [C[:2], C[2:]] for C, g in seen)                  # the search moved someone


def test_one_group_is_minibatch_sfl() -> None:
    """G = 1: the server's gradient is the whole concatenated batch's, as MiniBatch-SFL's (to float rounding)."""
    data = make_data(N, "dirichlet")
    spec = OptimizerSpec("sgd", LR, 0.9, 5e-4, 10.0)
    ours = engine_for("s2fl", {"participation": 0.5, "groups": 1}, data, 2, spec)
    theirs = engine_for("minibatch-sfl", {"participation": 0.5}, data, 2, spec)
    for t in range(1, 5):
        ours.run_round(t)
        theirs.run_round(t)
        assert torch.allclose(flat(*ours.eval_models()[0]), flat(*theirs.eval_models()[0]), atol=1e-6, rtol=0), t


def test_defaults_are_gas_setting_and_groups_need_participants() -> None:
    """10 of 20 devices, I = 20, SGD 0.01 with momentum 0.9, weight decay 5·10⁻⁴, clipping at 10, 2 groups; a period
    takes at least one participant per group."""
    strategy = make_strategy("s2fl")
    assert (strategy.participation, strategy.num_groups, strategy.min_participants) == (0.5, 2, 2)
    d = REGISTRY["s2fl"].defaults
    assert (d.lr, d.momentum, d.weight_decay, d.clip_norm, d.interval) == (0.01, 0.9, 5e-4, 10.0, 20)
    engine = engine_for("s2fl", {"participation": 0.1, "groups": 3}, make_data(N), 2)
    assert len(engine.run_round(1).participants) == 3
