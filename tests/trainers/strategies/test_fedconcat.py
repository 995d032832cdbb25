"""FedConcat (docs/algorithms.md "FedConcat"; its authors' experiments.py, ``--alg fedconcat``) against its update rule
written out with plain torch, sharing no code with the engine but the clustering (tested on its own below):

* stage 1: each global round the ⌈ρN⌉ devices drawn at its start take I plain SGD steps on the whole model; then
  each cluster averages the participants among its members (|𝒟_i|-weighted) into its own model, which they load;
  a member drawn after missing its cluster's last average loads that model first;
* after ``encoder_rounds`` global rounds: every cluster's encoder (its model but the last layer), frozen, side by
  side under a new linear classifier; each global round the drawn devices take I SGD steps on the classifier and it
  is averaged with equal weights.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from trainers.config.train_config import TrainConfig
from trainers.engine.split_engine import STRATEGY_STREAM
from trainers.inputs.partition import DeviceSampler
from trainers.run.driver import Trainer
from trainers.strategies.fedconcat import cluster_devices

N, RHO, B, LR, INTERVAL, K, ENCODER_ROUNDS, ROUNDS, SEED = 6, 0.5, 8, 0.1, 2, 2, 2, 8, 3


def trainer(tmp_path=None, rounds: int = ROUNDS, eval_every: int = 2, **more) -> Trainer:
    return Trainer(TrainConfig.flat(
        algorithm="fedconcat", dataset="synthetic", model="mlp", devices=N, rounds=rounds, interval=INTERVAL,
        eval_every=eval_every, batch_size=B, local_test_fraction=0.1, lr=LR, momentum=0.0, weight_decay=0.0, clip_norm=0.0, partition="dirichlet",
        seed=SEED, progress=False, out=None if tmp_path is None else str(tmp_path), checkpoint_every=1,
        extra={"clusters": K, "encoder_rounds": ENCODER_ROUNDS, "participation": RHO}, **more))


def sgd_steps(model: nn.Module, params: list[nn.Parameter], x: torch.Tensor, y: torch.Tensor) -> None:
    loss = nn.functional.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, params)
    with torch.no_grad():
        for p, g in zip(params, grads):
            p -= LR * g


def average(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    return {k: sum(w * s[k] for w, s in zip(weights, states)) / sum(weights) for k in states[0]}


def fedconcat_reference(initial: nn.Sequential, parts, x, y, classifier_init: dict[str, torch.Tensor]):
    """(groups, each cluster's model at the switch, the classifier after the last round)."""
    rng = np.random.default_rng([SEED, STRATEGY_STREAM])
    sizes = [float(len(p)) for p in parts]
    counts = [np.bincount(y[p].numpy(), minlength=10) for p in parts]
    models = [copy.deepcopy(initial) for _ in range(N)]
    samplers = [DeviceSampler(parts[i], B, [SEED, i]) for i in range(N)]
    groups: tuple[int, ...] = ()
    clusters: dict[int, dict[str, torch.Tensor]] = {}
    stale: set[int] = set()
    switch = ENCODER_ROUNDS * INTERVAL
    heads: list[nn.Linear] = []
    head_global: dict[str, torch.Tensor] = {}
    encoders: nn.Module | None = None
    for t in range(1, ROUNDS + 1):
        if (t - 1) % INTERVAL == 0:
            drawn = sorted(int(d) for d in rng.choice(N, size=math.ceil(RHO * N), replace=False))
            for i in drawn:
                if i in stale:
                    if t <= switch and groups[i] in clusters:
                        models[i].load_state_dict(clusters[groups[i]])
                    elif t > switch:
                        heads[i].load_state_dict(head_global)
                stale.discard(i)
        for i in drawn:
            idx = torch.from_numpy(samplers[i].next())
            if t <= switch:
                sgd_steps(models[i], list(models[i].parameters()), x[idx], y[idx])
            else:
                with torch.no_grad():
                    features = encoders(x[idx])
                sgd_steps(heads[i], list(heads[i].parameters()), features, y[idx])
        if t % INTERVAL:
            continue
        if t <= switch:
            if not groups:
                groups = cluster_devices(counts, K, rng)
            for g in sorted({groups[i] for i in drawn}):
                members = [i for i in drawn if groups[i] == g]
                clusters[g] = average([models[i].state_dict() for i in members], [sizes[i] for i in members])
                for i in members:
                    models[i].load_state_dict(clusters[g])
        else:
            head_global = average([heads[i].state_dict() for i in drawn], [1.0] * len(drawn))   # equal weights
            for i in drawn:
                heads[i].load_state_dict(head_global)
        stale = set(range(N)) - set(drawn)
        if t == switch:           # the K encoders, frozen, side by side; a new classifier on every device
            cluster_models = [copy.deepcopy(initial) for _ in range(max(groups) + 1)]
            for g, m in enumerate(cluster_models):
                m.load_state_dict(clusters[g])
            parts_ = [nn.Sequential(*list(m)[:-1]) for m in cluster_models]
            encoders = ConcatReference(parts_)
            heads = [nn.Linear(classifier_init["weight"].shape[1], 10) for _ in range(N)]
            for h in heads:
                h.load_state_dict(classifier_init)
            head_global, stale = classifier_init, set()
            samplers = [DeviceSampler(parts[i], B, [SEED, i]) for i in range(N)]   # the roles are built anew
    return groups, cluster_models, head_global


class ConcatReference(nn.Module):
    def __init__(self, encoders: list[nn.Module]) -> None:
        super().__init__()
        self.encoders = encoders

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([e(x).flatten(1) for e in self.encoders], dim=1)


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_fedconcat_is_clustered_fedavg_then_a_classifier_over_the_frozen_concatenated_encoders() -> None:
    """6 devices, ρ = 0.5, I = 2, K = 2, 2 encoder rounds then 2 classifier rounds (8 rounds): each cluster's model at
    the switch and the final classifier equal the reference to 1e-5; the frozen encoders are the clusters' own; the
    history marks the change; stage 2 is charged the encoders' forward but no backward."""
    tr = trainer()
    initial = copy.deepcopy(tr.blocks)
    data = tr.engine.data
    history = tr.run()
    groups, cluster_models, head = fedconcat_reference(initial, data.parts, data.x_train, data.y_train,
                                                       tr.strategy.classifier)
    assert tr.strategy.groups == groups and len(set(groups)) == K
    frozen = flat(list(tr.engine.global_model())[0])   # the encoders the run froze: each cluster's own, in order
    expected = torch.cat([flat(nn.Sequential(*list(model)[:-1])) for model in cluster_models])
    assert frozen.shape == expected.shape and torch.allclose(frozen, expected, atol=1e-5, rtol=0)
    final = list(tr.engine.global_model())[-1]
    assert torch.allclose(flat(final), torch.cat([head["weight"].reshape(-1), head["bias"]]), atol=1e-5, rtol=0)
    switch = ENCODER_ROUNDS * INTERVAL         # stage 1's last evaluation: the mean accuracy of the cluster models
    accuracies = [float((m(data.x_test).argmax(1) == data.y_test).float().mean()) for m in cluster_models]
    assert history.records[switch - 1].accuracy == pytest.approx(np.mean(accuracies), abs=1e-6)
    assert len(set(accuracies)) > 1                                  # the clusters' models differ in accuracy
    held = [torch.from_numpy(rows) for rows in data.local_test]      # the local protocol: each its cluster's model
    correct = sum(int((cluster_models[groups[d]](data.x_train[rows]).argmax(1) == data.y_train[rows]).sum())
                  for d, rows in enumerate(held))
    assert history.records[switch - 1].local_accuracy == pytest.approx(correct / sum(len(r) for r in held), abs=1e-9)
    concatenated = nn.Sequential(ConcatReference([nn.Sequential(*list(m)[:-1]) for m in cluster_models]),
                                 nn.Linear(head["weight"].shape[1], 10))
    concatenated[1].load_state_dict(head)
    final_accuracy = float((concatenated(data.x_test).argmax(1) == data.y_test).float().mean())
    assert history.records[-1].accuracy == pytest.approx(final_accuracy, abs=1e-6)
    seconds = [r.sim_seconds for r in history.records]               # the clock goes on across the change
    assert all(b > a for a, b in zip(seconds, seconds[1:]))
    (change,) = [e for e in history.events if e["event"] == "model"]
    assert change["round"] == switch and change["num_blocks"] == 2
    assert change["block_names"] == ["0:ConcatenatedEncoders", "1:Linear"]
    assert tr.profile.cut_points[0].bp_flops == 0.0                  # frozen: charged forward only
    assert tr.clock.profile is tr.profile and tr.engine.clock is tr.clock   # ... by the clock of stage 2's rounds
    last = history.records[-1]                # stage 2's average moves the classifier alone: eq. (22)'s δ/r for its bytes
    share = tr.engine.block_bytes[1] / (tr.engine.block_bytes[0] + tr.engine.block_bytes[1])
    times = tr.clock.stage_times(last.round, tr.engine.cuts)
    assert last.aggregated and share < 0.1
    assert last.stage_seconds["model upload"] == pytest.approx(max(times.model_up[d] for d in last.participants) * share)
    assert tr.profile.cut_points[0].fp_flops == pytest.approx(K * sum(c.fp_flops for c in [
        Trainer(tr.config).profile.cut_points[1]]))                    # K encoders (mlp: its first two blocks)


@pytest.mark.parametrize("stop", [4, 5])
def test_a_run_resumed_after_the_switch_equals_a_straight_run(tmp_path, stop: int) -> None:
    """Stopped right after the switch (round 4) or within stage 2 (round 5) and resumed, evaluated every round (round
    5's evaluation is before stage 2's first average: its classifier at its initial weights, which come from the
    checkpoint, not from torch's generator at the resume): the same losses, accuracies and final classifier as a
    straight run."""
    straight = trainer(eval_every=1)
    straight.run()
    first = trainer(tmp_path, rounds=stop, eval_every=1)
    first.run()
    resumed = trainer(tmp_path, eval_every=1, resume=True)
    torch.rand(7)             # torch's generator elsewhere than at the switch: the classifier's w⁰ is the checkpoint's
    resumed.run()
    assert [r.train_loss for r in resumed.history.records] == [r.train_loss for r in straight.history.records]
    assert [r.accuracy for r in resumed.history.records] == [r.accuracy for r in straight.history.records]
    assert flat(resumed.engine.global_model()).equal(flat(straight.engine.global_model()))


def test_clusters_are_the_label_families() -> None:
    """Three families of label distributions (classes 0–2, 3–5, 6–9), noisy counts: K = 3 finds them (labels
    0, 1, 2 in some order); K above the devices' number gives each its own."""
    rng = np.random.default_rng(0)
    families = [0, 1, 2, 0, 1, 2, 2, 0]
    spans = [(0, 3), (3, 6), (6, 10)]
    counts = []
    for f in families:
        c = np.zeros(10)
        lo, hi = spans[f]
        c[lo:hi] = rng.integers(20, 40, hi - lo)
        counts.append(c)
    groups = cluster_devices(counts, 3, np.random.default_rng(1))
    assert sorted(set(groups)) == [0, 1, 2]
    assert all((groups[a] == groups[b]) == (families[a] == families[b]) for a in range(8) for b in range(8))
    assert sorted(cluster_devices(counts[:2], 5, np.random.default_rng(1))) == [0, 1]


def test_the_clusters_are_the_least_inertia_of_the_runs() -> None:
    """60 random instances (7 devices, 4 labels, K = 2 and 3) against the partition of least inertia found by trying
    every one: the best of 10 k-means++ runs is it in 55 (measured); one run alone, or a choice by anything but the
    inertia Σ‖p_i − c_(g_i)‖², is it in at most 25 (measured)."""
    import itertools

    def optimum(p: np.ndarray, k: int) -> np.ndarray:
        best: tuple[float, np.ndarray] | None = None
        for a in itertools.product(range(k), repeat=len(p)):
            a_ = np.array(a)
            if len(set(a)) == k:
                inertia = sum(float(((p[a_ == g] - p[a_ == g].mean(0)) ** 2).sum()) for g in range(k))
                if best is None or inertia < best[0] - 1e-12:
                    best = (inertia, a_)
        assert best is not None
        return best[1]

    found = 0
    for seed in range(30):
        counts = [c + 1.0 for c in np.random.default_rng(seed).integers(0, 30, (7, 4))]
        p = np.stack([c / c.sum() for c in counts])
        for k in (2, 3):
            best, got = optimum(p, k), cluster_devices(counts, k, np.random.default_rng(seed))
            found += all((best[i] == best[j]) == (got[i] == got[j]) for i in range(7) for j in range(7))
    assert found >= 55


def test_clusters_are_of_label_distributions_not_of_counts() -> None:
    """Two label mixes, each on a device of 10 samples and one of 1,000: the clusters follow the mix (p_i =
    counts / |D_i|), not the size."""
    mixes = [np.array([0.9, 0.1, 0, 0]), np.array([0, 0, 0.1, 0.9])]
    counts = [mixes[0] * 10, mixes[0] * 1000, mixes[1] * 10, mixes[1] * 1000]
    groups = cluster_devices(counts, 2, np.random.default_rng(0))
    assert groups[0] == groups[1] != groups[2] == groups[3]


def test_a_model_whose_last_block_is_not_one_linear_layer_is_refused() -> None:
    from trainers.strategies.fedconcat import FedConcat

    strategy = FedConcat(encoder_rounds=1)
    template = nn.Sequential(nn.Conv2d(1, 2, 3))
    assert strategy.model_for(template) is template                  # stage 1: the run's model itself
    strategy.model_stage, strategy.encoders = 1, [[]]
    with pytest.raises(ValueError, match="last block must hold one nn.Linear layer, not \\['Conv2d'\\]"):
        strategy.model_for(nn.Sequential(nn.Conv2d(1, 2, 3)))


def test_a_model_a_second_stage_cannot_be_built_from_is_refused_before_any_training(monkeypatch) -> None:
    """Stage 2 needs the model's last block to be one nn.Linear: a run of a model whose last block holds a
    BatchNorm too is refused when it is made (InputError naming the model), not after its encoder rounds; the
    check leaves torch's generator where it was (the runs' numbers do not move)."""
    from adaptplan.errors import InputError
    from trainers.run import driver
    from trainers.strategies import later_models
    from trainers.strategies.fedconcat import FedConcat

    monkeypatch.setattr(driver, "build_model", lambda name, shape, classes, width: nn.Sequential(
        nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10), nn.BatchNorm1d(10)))
    with pytest.raises(InputError, match="fedconcat cannot train this model: .*not \\['Linear', 'BatchNorm1d'\\]") as err:
        trainer()
    assert err.value.field == "model"
    template = nn.Sequential(nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU()), nn.Linear(16, 10))
    torch.manual_seed(4)
    (model,) = later_models(FedConcat(clusters=3), template)
    after = torch.rand(3)
    torch.manual_seed(4)
    assert torch.equal(torch.rand(3), after) and model[1].in_features == 48


def test_the_second_stage_architecture_is_k_encoders_under_one_linear_layer() -> None:
    """What a device rank builds from the run's model and the spec rank 0 sends (``stage_spec``): K deep copies of
    every block but the last, frozen, their features concatenated under Linear(K·F, M); the spec is checked."""
    from trainers.strategies.fedconcat import FedConcat

    template = nn.Sequential(nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU()), nn.Linear(16, 10))
    assert FedConcat.stage_architecture(template, {}) is template
    model = FedConcat.stage_architecture(template, {"encoders": 3})
    encoders, classifier = model
    assert isinstance(classifier, nn.Linear) and (classifier.in_features, classifier.out_features) == (48, 10)
    assert len(encoders.encoders) == 3 and not any(p.requires_grad for p in encoders.parameters())
    assert all(e[0][1] is not template[0][1] for e in encoders.encoders)          # copies, not the run's blocks
    x = torch.randn(5, 1, 8, 8)
    assert torch.equal(encoders(x), torch.cat([template[0](x)] * 3, dim=1))
    for bad in ({"encoders": 0}, {"encoders": 2.0}, {"encoders": True}, {"encoders": 2, "more": 1}, {"k": 2}):
        with pytest.raises(ValueError, match="FedConcat's second stage is"):
            FedConcat.stage_architecture(template, bad)
    strategy = FedConcat(clusters=4)
    assert strategy.stage_spec() == {} and strategy.stage_specs() == [{"encoders": 4}]
    strategy.model_stage, strategy.encoders = 1, [[{}], [{}]]
    assert strategy.stage_spec() == {"encoders": 2}


def test_the_history_keeps_the_change_of_model_and_refuses_a_malformed_one() -> None:
    from adaptplan.errors import InputError
    from trainers.run.history import History

    good = {"round": 4, "event": "model", "stage": 1, "num_blocks": 2, "block_names": ["0:A", "1:Linear"]}
    assert History.from_json({"meta": {}, "records": [], "events": [good]}).events == [good]
    for bad, field in (({**good, "stage": 0}, "stage"), ({**good, "block_names": "0:A"}, "block_names")):
        with pytest.raises(InputError) as err:
            History.from_json({"meta": {}, "records": [], "events": [bad]})
        assert err.value.field.endswith(field)


def test_a_state_that_does_not_fit_the_run_is_refused() -> None:
    """Clusters naming another number of devices, a stage other than 0 and 1, stage 2 without one encoder per cluster
    or without clusters: each a ValueError naming what is wrong (the run turns it into one message about the
    checkpoint)."""
    tr = trainer()
    ctx = tr.engine.context(1)
    good = {"groups": [0, 1, 0, 1, 0, 1], "aggregations": 2, "model_stage": 1, "encoders": [[], []], "classifier": {}}
    tr.strategy.load_state_dict(good)
    tr.strategy.check_state(ctx)
    tr.strategy.load_state_dict({**good, "model_stage": 0, "encoders": []})
    tr.strategy.check_state(ctx)
    for bad, message in (({"groups": [0, 1]}, "clusters name 2 devices, the run has 6"),
                         ({"model_stage": 2}, "stage 0, or stage 1 with one encoder per cluster"),
                         ({"encoders": [[]]}, "stage 0, or stage 1 with one encoder per cluster"),
                         ({"groups": None}, "stage 0, or stage 1 with one encoder per cluster")):
        tr.strategy.load_state_dict({**good, **bad})
        with pytest.raises(ValueError, match=message):
            tr.strategy.check_state(ctx)
