"""SCALA (docs/algorithms.md, SCALA) against an independent reference written from B.2's pseudo-code:
participants per global iteration, B_k of eq. (3), LA-CE cut gradients at the pre-update server
(eqs. 6, 13), one server step on the concatenated batch with its label prior (eqs. 5, 12), |D_k|-weighted
FedAvg of the client parts every I rounds (eq. 8), downloaded by the next global iteration's participants only, at
its start (step 2). Plus the loss's sanity
properties (B.3) and the flags' bad-input handling."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from tests.cli_checks import assert_train_flag_error
from tests.concatenated_reference import CUT, LR, B, M, N, la_ce, reference_scala
from tests.engine_builders import flat, make_data, small_model
from tests.reference_optim import HandSGD
from trainers.api import label_prior, logit_adjusted_ce
from trainers.engine.split_engine import DeviceData, SplitEngine
from trainers.roles.optim import OptimizerSpec
from trainers.strategies import SCALA


def sgd(module: nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            if p.grad is not None:
                p -= LR * p.grad
                p.grad = None


def make_scala_engine(data: DeviceData, interval: int, optimizer=None, **options) -> SplitEngine:
    return SplitEngine(small_model(), [CUT] * N, SCALA(**options), data, optimizer or {"lr": LR, "momentum": 0.0},
                       batch_size=B, seed=0, interval=interval)


def engine_server(engine: SplitEngine) -> torch.Tensor:
    return flat(*[engine.edge.instances[(None, j)] for j in range(CUT, 11)])


@pytest.mark.parametrize("server_prior,defaults", [("batch", False), ("round", False), ("batch", True)])
def test_scala_matches_reference_from_the_spec(server_prior: str, defaults: bool) -> None:
    """Plain SGD, and the defaults' optimizer (momentum 0.9, weight decay 5e-4, clipping; a small clip norm so that
    clipping acts), whose momentum restarts when the devices load the global client model."""
    data, interval, rho = make_data(N, "dirichlet"), 2, 0.5
    hand = HandSGD(LR, 0.9, 5e-4, 1.0) if defaults else None
    spec = OptimizerSpec("sgd", LR, 0.9, 5e-4, 1.0) if defaults else None
    engine = make_scala_engine(data, interval, spec, participation=rho, server_prior=server_prior)
    drawn = []
    for t, C, batch, clients, server, global_client, losses in reference_scala(data, 6, interval, rho, server_prior,
                                                                               hand):
        stats = engine.run_round(t)
        assert stats.loss == pytest.approx(sum(losses.values()) / len(losses), rel=1e-5), t     # eq. (13)'s ℓ_k
        drawn.append(tuple(C))
        assert stats.participants == C
        assert stats.aggregated == (t % interval == 0)
        assert {k: engine.strategy.batch_size(engine.context(t), k) for k in C} == batch
        assert torch.allclose(engine_server(engine), flat(server), atol=1e-5, rtol=0), f"server, round {t}"
        for k in range(N):       # a device not drawn holds what it last trained (stale), not the average
            assert torch.allclose(flat(engine.devices[k].blocks), flat(clients[k]), atol=1e-5, rtol=0), \
                f"device {k}, round {t}"
        if global_client is not None:   # evaluated: the average of the last aggregation, held by no device
            evaluated = engine.eval_models()[0]
            assert torch.allclose(flat(*evaluated[:CUT]), torch.cat([p.reshape(-1) for p in global_client]),
                                  atol=1e-5, rtol=0), f"global model, round {t}"
    # drawn once per global iteration (rounds 1, 3, 5), kept within it, and not the same every time
    assert drawn[0::2] == drawn[1::2] and len(set(drawn)) > 1
    assert len(set(batch.values())) > 1                     # unequal B_k (eq. 3) exercised


def test_only_the_next_global_iterations_participants_download_the_average() -> None:
    """B.2 steps 2 and 5: the average is downloaded at the start of the next global iteration by its ⌈ρK⌉
    participants (client blocks, fp32), not broadcast to all K when it is finished; round 1 downloads nothing
    (every device holds w⁰). Each round's other downward bytes are the cut gradients, B_k fp32 activations each."""
    data, interval = make_data(N, "dirichlet"), 2
    engine = make_scala_engine(data, interval, participation=0.5)
    client_bytes = 4 * sum(p.numel() for p in small_model()[:CUT].parameters())
    per_sample = 4 * small_model()[:CUT](data.x_train[:1]).numel()
    for t in range(1, 7):
        stats = engine.run_round(t)
        ctx = engine.context(t)
        gradient_bytes = per_sample * sum(engine.strategy.batch_size(ctx, k) for k in stats.participants)
        starts = t > 1 and (t - 1) % interval == 0
        assert stats.bytes_down - gradient_bytes == (client_bytes * len(stats.participants) if starts else 0), t
        # after an average every device is stale; the participants drawn next come up to date at their start
        held = set() if t == 1 else set(range(N)) if stats.aggregated else set(range(N)) - set(stats.participants)
        assert engine.stale == held, t


def test_batch_sizes_follow_eq_3() -> None:
    data = make_data(N, "dirichlet")
    engine = make_scala_engine(data, 1, participation=1.0)
    stats = engine.run_round(1)
    sizes = engine.data_sizes()
    ctx = engine.context(1)
    for k in stats.participants:
        assert engine.strategy.batch_size(ctx, k) == max(int(sizes[k] * B * N / sum(sizes)), 1)
    assert engine.devices[0].sampler.position == max(int(sizes[0] * B * N / sum(sizes)), 1)


def test_cut_gradients_from_pre_update_server_and_step_on_concatenated_batch() -> None:
    """One round: G_k = ∂ℓ_k/∂A_k at the server before its step (not after); the step is one SGD step on
    the LA-CE of the concatenated batch with the batch's label prior."""
    data = make_data(N, "dirichlet")
    engine = make_scala_engine(data, 1, participation=1.0)
    captured = {}
    serve = engine.strategy.serve

    def spy(edge, ctx, arrivals):
        captured["pre"] = copy.deepcopy(nn.Sequential(*[edge.server.instances[(None, j)] for j in range(CUT, 11)]))
        captured["arrivals"] = list(arrivals)
        captured["replies"] = serve(edge, ctx, arrivals)
        return captured["replies"]

    engine.strategy.serve = spy
    engine.run_round(1)
    pre = captured["pre"]
    post = nn.Sequential(*[engine.edge.instances[(None, j)] for j in range(CUT, 11)])
    priors = [c / c.sum() for c in engine.label_counts]
    for a, reply in zip(captured["arrivals"], captured["replies"]):
        x = a.tensor.detach().requires_grad_(True)
        g_pre = torch.autograd.grad(la_ce(pre(x), a.labels, priors[a.device]), x)[0]
        x2 = a.tensor.detach().requires_grad_(True)
        g_post = torch.autograd.grad(la_ce(post(x2), a.labels, priors[a.device]), x2)[0]
        assert torch.allclose(reply.tensor, g_pre, atol=1e-6, rtol=0)
        assert not torch.allclose(reply.tensor, g_post, atol=1e-6, rtol=0)
        # the client's own prior, not plain CE (the device has a skewed label histogram)
        x3 = a.tensor.detach().requires_grad_(True)
        g_ce = torch.autograd.grad(nn.functional.cross_entropy(pre(x3), a.labels), x3)[0]
        assert not torch.allclose(reply.tensor, g_ce, atol=1e-6, rtol=0)
    A = torch.cat([a.tensor for a in captured["arrivals"]])
    Y = torch.cat([a.labels for a in captured["arrivals"]])
    expected = copy.deepcopy(pre)
    la_ce(expected(A), Y, np.bincount(Y.numpy(), minlength=M) / len(Y)).backward()
    sgd(expected)
    assert torch.allclose(flat(post), flat(expected), atol=1e-6, rtol=0)
    # a per-device (non-concatenated) server step differs: B_k-weighted concat ≠ mean of per-device losses
    per_device = copy.deepcopy(pre)
    sum(la_ce(per_device(a.tensor), a.labels, np.bincount(a.labels.numpy(), minlength=M) / len(a.labels))
        for a in captured["arrivals"]).div(N).backward()
    sgd(per_device)
    assert not torch.allclose(flat(post), flat(per_device), atol=1e-6, rtol=0)


# ---- the loss (B.3 sanity properties) --------------------------------------------------------------
def test_la_ce_with_uniform_prior_is_plain_ce() -> None:
    torch.manual_seed(0)
    logits, y = torch.randn(32, M) * 3, torch.randint(0, M, (32,))
    uniform = label_prior(np.full(M, 7))
    assert torch.allclose(logit_adjusted_ce(logits, y, uniform), nn.functional.cross_entropy(logits, y), atol=1e-6)
    skewed = label_prior(np.arange(1, M + 1))
    assert not torch.allclose(logit_adjusted_ce(logits, y, skewed), nn.functional.cross_entropy(logits, y), atol=1e-4)
    assert torch.allclose(logit_adjusted_ce(logits, y, skewed), la_ce(logits, y, np.arange(1, M + 1) / 55), atol=1e-6)


def test_zero_prior_class_gets_no_gradient() -> None:
    torch.manual_seed(0)
    counts = np.array([5, 0, 3, 2, 0, 1, 1, 1, 1, 1])
    y = torch.tensor([0, 2, 3, 5, 0, 9])
    logits = (torch.randn(6, M) * 3).requires_grad_(True)
    logit_adjusted_ce(logits, y, label_prior(counts)).backward()
    for c in (1, 4):
        assert float(logits.grad[:, c].abs().max()) < 1e-9
    assert float(logits.grad[:, 0].abs().max()) > 1e-3
    # with plain CE the absent classes are pushed down
    logits.grad = None
    nn.functional.cross_entropy(logits, y).backward()
    assert float(logits.grad[:, 1].abs().max()) > 1e-3


# ---- flags ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,flag", [
    (["--algorithm", "scala", "--la-tau", "-1"], "--la-tau"),
    (["--algorithm", "scala", "--participation", "0"], "--participation"),
    (["--algorithm", "scala", "--server-prior", "global"], "--server-prior"),
    (["--algorithm", "sfl-v2", "--la-tau", "0.5"], "--la-tau"),
])
def test_bad_scala_flags_exit_2(argv, flag, capsys) -> None:
    assert_train_flag_error(argv, flag, capsys)
