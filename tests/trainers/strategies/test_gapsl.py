"""GAPSL (docs/algorithms.md, GAPSL) against an independent reference written from A.2's pseudo-code
(steps 1–16, detached GDA), plus its defining properties: the leader-set size of eq. (2), the GDA
filter of eqs. (5)–(6), and the flags' bad-input handling."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from tests.cli_checks import assert_train_flag_error
from tests.engine_builders import flat, make_data, small_model
from tests.reference_optim import HandSGD
from trainers.engine.split_engine import DeviceData, SplitEngine
from trainers.inputs.partition import DeviceSampler
from trainers.roles.optim import OptimizerSpec
from trainers.strategies import GAPSL

CUT, B, LR, S = 9, 16, 0.1, 4




def angle(u: torch.Tensor, v: torch.Tensor) -> float:
    """arccos of the clamped cosine (A.2 step 4), in float64."""
    u, v = u.double(), v.double()
    return math.acos(max(-1.0, min(1.0, float(u @ v / (u.norm() * v.norm())))))


def reference_gapsl(data: DeviceData, rounds: int, total: int, k_min: float, k_max: float, eta: float,
                    mode: str = "detached", lam: float = 0.0, client: HandSGD | None = None,
                    server_opt: HandSGD | None = None, excluded: str = "plain", server_step: str = "mean"):
    """A.2 steps 1–16 in plain torch. ``mode``: ``detached`` (server step Σ_{Ŝ} w_i·g_i); ``double_backprop``
    (eq. 7: L_g = Σ_{Ŝ} w_i·[L_i + λ(1 − cos(g_i, g_lead))] back-propagated through the g_i to the server weights
    and the activations, g_lead a constant; each device gets ∂[L_i + λ(1 − cos)]/∂a_i); ``gradient_step`` (g̃_i =
    g_i − λ·∂(1 − cos(g_i, g_lead))/∂g_i by autograd, server step Σ_{Ŝ} w_i·g̃_i, plain cut gradients).
    ``server_step``: w_i = |𝒟_i|/Σ_{Ŝ}|𝒟_j| (``mean``, PSL's rule) or 1 (``sum``, eq. 8 literally).
    ``client``/``server_opt``: each role's optimizer (plain SGD at LR by default; the paper's setting has its own
    rate per role and momentum). ``excluded``: the devices outside Ŝ step on their own cut gradient ∂L_i/∂a_i
    (``plain``, §III-A) or not at all (``none``, A.3.2's literal reading)."""
    sizes = [float(len(p)) for p in data.parts]
    client, server_opt = client or HandSGD(LR), server_opt or HandSGD(LR)
    model = small_model()
    clients = [copy.deepcopy(nn.Sequential(*model[:CUT])) for _ in range(S)]
    server = copy.deepcopy(nn.Sequential(*model[CUT:]))
    samplers = [DeviceSampler(data.parts[i], B, [0, i]) for i in range(S)]
    nu_min, nu_max = math.inf, -math.inf
    log = []
    for t in range(1, rounds + 1):
        acts, grads, cut_grads, losses, leaves, graphs = [], [], [], [], [], []
        for i in range(S):                                                    # steps 1–3
            idx = torch.from_numpy(samplers[i].next())
            a = clients[i](data.x_train[idx])
            leaf = a.detach().requires_grad_(True)
            loss = nn.functional.cross_entropy(server(leaf), data.y_train[idx])
            g = torch.autograd.grad(loss, list(server.parameters()) + [leaf], create_graph=mode == "double_backprop")
            acts.append(a)
            graphs.append(torch.cat([x.reshape(-1) for x in g[:-1]]))
            grads.append(graphs[-1].detach())
            cut_grads.append(g[-1].detach())
            losses.append(loss)
            leaves.append(leaf)
        theta = [[angle(grads[i], grads[j]) for j in range(S)] for i in range(S)]            # step 4
        score = np.array([sum(theta[i][j] for j in range(S) if j != i) / (S - 1) for i in range(S)])  # eq. 1
        nu = float(score.std())                                               # population std
        nu_min, nu_max = min(nu_min, nu), max(nu_max, nu)
        stab = 1.0 if nu_max - nu_min < 1e-12 else (nu_max - nu) / (nu_max - nu_min)
        k = k_min + (t / total) * stab * (k_max - k_min)                      # eq. 2
        n_sel = math.ceil(k * S - 1e-9)                                       # eq. 3 (float guard: 0.6·5 = 3.0000000000000004)
        leaders = sorted(range(S), key=lambda i: score[i])[:n_sel]
        lead = torch.stack([grads[i] for i in leaders]).mean(0)               # eq. 4
        theta_lead = np.array([angle(grads[i], lead) for i in range(S)])     # eq. 5
        th = max(min(theta_lead.mean() - eta * theta_lead.std(), math.pi / 2), 0.0)   # eq. 6
        aligned = [i for i in range(S) if theta_lead[i] <= th] or [int(np.argmin(theta_lead))]
        w = {i: (sizes[i] / sum(sizes[j] for j in aligned) if server_step == "mean" else 1.0) for i in aligned}
        if mode == "double_backprop":                                         # eq. 7 exactly
            cos = [graphs[i] @ lead / (graphs[i].norm() * lead.norm()) for i in aligned]
            total_loss = sum(w[i] * (losses[i] + lam * (1 - c)) for i, c in zip(aligned, cos))
            g = torch.autograd.grad(total_loss, list(server.parameters()) + [leaves[i] for i in aligned])
            step = torch.cat([x.reshape(-1) for x in g[:len(g) - len(aligned)]])
            own = {i: gi / w[i] for i, gi in zip(aligned, g[len(g) - len(aligned):])}
            cut_grads = {**dict(enumerate(cut_grads)), **own}                 # Ŝ: eq. 7's
        elif mode == "gradient_step":                                         # g̃_i, derivative by autograd
            step = 0
            for i in aligned:
                gi = grads[i].clone().requires_grad_(True)
                (d,) = torch.autograd.grad(1 - gi @ lead / (gi.norm() * lead.norm()), [gi])
                step = step + w[i] * (grads[i] - lam * d)
        else:                                                                 # step 14: Σ_{Ŝ} w_i·g_i
            step = sum(w[i] * grads[i] for i in aligned)
        start = 0
        for p in server.parameters():
            p.grad = step[start:start + p.numel()].view_as(p).detach().clone()
            start += p.numel()
        server_opt.step(server)
        for i in (aligned if excluded == "none" else range(S)):               # steps 15–16, Ŝ only (A.3.2)
            acts[i].backward(cut_grads[i])
            client.step(clients[i])
        log.append({"k": k, "n_sel": n_sel, "aligned": aligned, "loss": float(torch.stack(losses).detach().mean())})
    return clients, server, log


def make_gapsl_engine(data: DeviceData, total: int, pass_samples: int | None = None, **options) -> SplitEngine:
    """``pass_samples``: the server's pass budget (default: the engine's)."""
    memory = {} if pass_samples is None else {"server_pass_samples": pass_samples}
    return SplitEngine(small_model(), [CUT] * S, GAPSL(**options), data, {"lr": LR, "momentum": 0.0},
                       batch_size=B, seed=0, total_rounds=total, **memory)


def test_gapsl_matches_reference_from_the_spec() -> None:
    data, rounds, total = make_data(S, "dirichlet"), 5, 5
    engine = make_gapsl_engine(data, total, k_min=0.25, k_max=0.75, eta_th=0.5)
    stats = [engine.run_round(t) for t in range(1, rounds + 1)]
    clients, server, log = reference_gapsl(data, rounds, total, 0.25, 0.75, 0.5)
    # the filter was exercised: some round leaves devices out, and K^t grows over the run
    assert any(len(r["aligned"]) < S for r in log)
    assert len({r["n_sel"] for r in log}) > 1
    for st, r in zip(stats, log):
        assert st.metrics["leader_fraction"] == pytest.approx(r["k"], abs=1e-5)
        assert st.metrics["leaders"] == r["n_sel"]
        assert st.metrics["aligned"] == len(r["aligned"])
        assert st.loss == pytest.approx(r["loss"], abs=1e-6)        # the round's loss: the mean of every device's L_i
    assert torch.allclose(flat(*[engine.edge.instances[(None, j)] for j in range(CUT, 11)]),
                          flat(server), atol=1e-5, rtol=0)
    for i in range(S):
        assert torch.allclose(flat(engine.devices[i].blocks), flat(clients[i]), atol=1e-5, rtol=0)


def test_eq_8_summed_literally_matches_the_reference() -> None:
    """server_step = sum: Σ_{Ŝ} g_i, eq. (8) as written (a step |Ŝ| times PSL's at the same rate)."""
    data, rounds = make_data(S, "dirichlet"), 4
    engine = make_gapsl_engine(data, rounds, k_min=0.25, k_max=0.75, eta_th=0.5, server_step="sum")
    for t in range(1, rounds + 1):
        engine.run_round(t)
    clients, server, log = reference_gapsl(data, rounds, rounds, 0.25, 0.75, 0.5, server_step="sum")
    mean_clients, mean_server, _ = reference_gapsl(data, rounds, rounds, 0.25, 0.75, 0.5)
    assert not torch.allclose(flat(server), flat(mean_server), atol=1e-5, rtol=0)    # the scaling matters here
    assert torch.allclose(flat(*[engine.edge.instances[(None, j)] for j in range(CUT, 11)]),
                          flat(server), atol=1e-5, rtol=0)
    for i in range(S):
        assert torch.allclose(flat(engine.devices[i].blocks), flat(clients[i]), atol=1e-5, rtol=0)


def test_devices_outside_the_aligned_set_get_no_update_when_asked() -> None:
    data = make_data(S, "dirichlet")
    engine = make_gapsl_engine(data, 1, k_min=0.25, k_max=0.75, eta_th=0.5, excluded_update="none")
    before = [flat(d.blocks) for d in engine.devices]
    engine.run_round(1)
    _, _, log = reference_gapsl(data, 1, 1, 0.25, 0.75, 0.5, excluded="none")
    aligned = set(log[0]["aligned"])
    assert 0 < len(aligned) < S
    for i in range(S):
        changed = not torch.equal(before[i], flat(engine.devices[i].blocks))
        assert changed == (i in aligned)


# ---- the leader fraction of eq. (2) ------------------------------------------------------------------
@pytest.mark.parametrize("k_min,k_max", [(0.2, 0.8), (0.1, 1.0), (0.5, 0.5)])
def test_leader_fraction_follows_eq_2(k_min: float, k_max: float) -> None:
    s = GAPSL(k_min=k_min, k_max=k_max)
    rng = np.random.default_rng(0)
    T = 10
    for t in range(1, T + 1):
        nu = float(rng.uniform(0.1, 1.0))
        k = s.leader_fraction(nu, t / T)
        assert k_min - 1e-12 <= k <= k_max + 1e-12
        stab = 1.0 if s.nu_max - s.nu_min < 1e-12 else (s.nu_max - nu) / (s.nu_max - s.nu_min)
        assert k == pytest.approx(k_min + (t / T) * stab * (k_max - k_min))
    # ν at its running minimum at t = T: stab = 1, K^T = K_max
    assert s.leader_fraction(s.nu_min, 1.0) == pytest.approx(k_max)
    # ν at its running maximum: stab = 0, K = K_min whatever t is
    assert s.leader_fraction(s.nu_max, 1.0) == pytest.approx(k_min)


def test_leader_set_size_is_ceil_k_times_s() -> None:
    torch.manual_seed(0)
    S_ = 7
    grads = torch.randn(S_, 30)
    for progress in (0.0, 0.3, 0.7, 1.0):
        s = GAPSL(k_min=0.2, k_max=0.8)
        _, _, m = s.select(grads, progress)            # first call: ν_min = ν_max, stab = 1
        k = 0.2 + progress * 0.6
        assert m["leader_fraction"] == pytest.approx(k)
        assert m["leaders"] == math.ceil(k * S_ - 1e-9)
    # K^t·S an exact integer: no extra leader from rounding (0.6·5 = 3.0000000000000004)
    s = GAPSL(k_min=0.6, k_max=0.6)
    assert s.select(torch.randn(5, 30), 1.0)[2]["leaders"] == 3


# ---- the GDA filter ----------------------------------------------------------------------------------
def test_identical_gradients_all_aligned_at_angle_zero() -> None:
    g = torch.randn(1, 20).repeat(5, 1)
    aligned, lead, m = GAPSL().select(g, 0.5)
    assert aligned == list(range(5))
    assert m["mean_pairwise_angle"] == pytest.approx(0.0, abs=1e-3)
    assert torch.allclose(lead, g[0], atol=1e-6)


def test_two_opposite_clusters_select_the_leaders_cluster() -> None:
    torch.manual_seed(1)
    u = torch.randn(16)
    # 4 devices near +u (the majority: their consistency scores θ_i are smallest), 2 near −u
    g = torch.stack([u + 0.05 * torch.randn(16) for _ in range(4)] + [-u + 0.05 * torch.randn(16) for _ in range(2)])
    aligned, lead, _ = GAPSL(k_min=0.2, k_max=0.5, eta_th=0.5).select(g, 1.0)
    assert aligned == [0, 1, 2, 3]
    assert float(nn.functional.cosine_similarity(lead, u, dim=0)) > 0.9


def test_threshold_clipped_and_aligned_set_never_empty() -> None:
    torch.manual_seed(2)
    g = torch.randn(6, 10)
    # a huge η_th drives μ − η·σ below 0: θ_th = 0, Ŝ falls back to the device of smallest angle
    aligned, lead, _ = GAPSL(eta_th=1e6).select(g, 1.0)
    theta = torch.arccos(nn.functional.cosine_similarity(g, lead[None, :]).clamp(-1, 1))
    assert aligned == [int(torch.argmin(theta))]
    # η_th = 0 and orthogonal-ish gradients: θ_th = min(μ, π/2) ≤ π/2, Ŝ = devices at or below the mean angle
    aligned, lead, _ = GAPSL(eta_th=0.0).select(g, 1.0)
    theta = torch.arccos(nn.functional.cosine_similarity(g, lead[None, :]).clamp(-1, 1))
    th = min(float(theta.mean()), math.pi / 2)
    assert aligned == [i for i in range(6) if float(theta[i]) <= th + 1e-6]


def test_aligned_devices_never_beyond_a_right_angle() -> None:
    """θ_th ∈ [0, π/2] (eq. 6): an aligned device's angle to the lead is at most π/2 (or it is the
    single fallback of smallest angle), and Ŝ is never empty."""
    g = torch.Generator().manual_seed(3)
    for trial in range(30):
        S_ = 3 + trial % 6
        grads = torch.randn(S_, 12, generator=g)
        grads[: S_ // 2] *= -1 if trial % 2 else 1
        eta = [0.0, 0.5, 2.0, 50.0][trial % 4]
        aligned, lead, _ = GAPSL(eta_th=eta).select(grads, (trial % 5) / 4)
        theta = [angle(grads[i], lead) for i in range(S_)]
        assert aligned
        if len(aligned) > 1 or theta[aligned[0]] <= math.pi / 2:
            assert all(theta[i] <= math.pi / 2 + 1e-5 for i in aligned)
        mu, sd = float(np.mean(theta)), float(np.std(theta))
        th = max(min(mu - eta * sd, math.pi / 2), 0.0)
        expected = [i for i in range(S_) if theta[i] <= th] or [int(np.argmin(theta))]
        assert aligned == expected or abs(min(abs(t - th) for t in theta)) < 1e-5   # a float tie at θ_th


@pytest.mark.parametrize("mode", ["double_backprop", "gradient_step"])
def test_gda_modes_reduce_to_detached_when_lambda_is_zero(mode: str) -> None:
    """With λ = 0 the regulariser vanishes: exact eq. 7 (double backprop) and the gradient-space surrogate
    give the detached update; with λ > 0 they differ from it."""
    data = make_data(S, "dirichlet")
    runs = {}
    for name, options in (("detached", {}), ("zero", {"gda": mode, "gda_lambda": 0.0}),
                          ("lambda", {"gda": mode, "gda_lambda": 0.5})):
        engine = make_gapsl_engine(data, 3, eta_th=0.5, **options)
        for t in (1, 2, 3):
            engine.run_round(t)
        runs[name] = torch.cat([flat(*[engine.edge.instances[(None, j)] for j in range(CUT, 11)])] +
                               [flat(d.blocks) for d in engine.devices])
    assert torch.allclose(runs["zero"], runs["detached"], atol=1e-6, rtol=0)
    assert not torch.allclose(runs["lambda"], runs["detached"], atol=1e-6, rtol=0)


# ---- flags ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,flag", [
    (["--algorithm", "gapsl", "--k-min", "2"], "--k-min"),
    (["--algorithm", "gapsl", "--k-min", "0.5", "--k-max", "0.3"], "--k-max"),
    (["--algorithm", "gapsl", "--eta-th", "-1"], "--eta-th"),
    (["--algorithm", "gapsl", "--gda", "exact"], "--gda"),
    (["--algorithm", "psl", "--k-min", "0.3"], "--k-min"),
])
def test_bad_gapsl_flags_exit_2(argv, flag, capsys) -> None:
    assert_train_flag_error(argv, flag, capsys)


def test_option_ranges_include_their_closed_ends() -> None:
    """docs: K_min in (0, 1], K_max in [K_min, 1], η_th ≥ 0, λ ≥ 0 — the closed ends are accepted (the options'
    limits are the registry's, checked by make_strategy; K_min ≤ K_max by the strategy)."""
    from adaptplan.errors import InputError
    from trainers.strategies import make_strategy

    edge = make_strategy("gapsl", dict(k_min=1.0, k_max=1.0, eta_th=0.0, gda_lambda=0.0))
    assert (edge.k_min, edge.k_max, edge.eta_th, edge.lam) == (1.0, 1.0, 0.0, 0.0)
    assert make_strategy("gapsl", dict(k_min=0.3, k_max=0.3)).k_max == 0.3
    for bad, flag in ((dict(k_min=0.0), "--k-min"), (dict(k_min=0.5, k_max=1.0000001), "--k-max"),
                      (dict(k_min=0.5, k_max=0.4999), "--k-max"), (dict(eta_th=float("inf")), "--eta-th"),
                      (dict(gda_lambda=-1e-9), "--gda-lambda")):
        with pytest.raises(InputError) as info:
            make_strategy("gapsl", bad)
        assert info.value.field == flag


def test_tied_scores_lead_in_device_order() -> None:
    """20 devices, 10 with gradient e1 then 10 with e2: every consistency score is (10·π/2)/19, a tie. At
    progress 0, K = K_min = 0.2 → ⌈0.2·20⌉ = 4 leaders, the first four devices (ties in device order, so a
    run is reproducible): g_lead = e1, θ_lead = 0 for devices 0..9 and π/2 for the rest; θ_th = π/4 − 0.5·π/4
    = π/8 → the aligned set is devices 0..9."""
    from trainers.strategies import GAPSL

    grads = torch.zeros(20, 3)
    grads[:10, 0] = 1.0
    grads[10:, 1] = 1.0
    aligned, lead, metrics = GAPSL().select(grads, progress=0.0)
    assert metrics["leaders"] == 4.0 and metrics["leader_fraction"] == pytest.approx(0.2)
    assert torch.equal(lead, torch.tensor([1.0, 0.0, 0.0]))
    assert aligned == list(range(10))


@pytest.mark.parametrize("mode", ["double_backprop", "gradient_step"])
def test_gda_modes_match_reference_from_the_spec(mode: str) -> None:
    data, rounds = make_data(S, "dirichlet"), 3
    engine = make_gapsl_engine(data, rounds, k_min=0.25, k_max=0.75, eta_th=0.5, gda=mode, gda_lambda=0.5)
    stats = [engine.run_round(t) for t in range(1, rounds + 1)]
    clients, server, log = reference_gapsl(data, rounds, rounds, 0.25, 0.75, 0.5, mode=mode, lam=0.5)
    detached, _, _ = reference_gapsl(data, rounds, rounds, 0.25, 0.75, 0.5)
    assert [st.loss for st in stats] == pytest.approx([r["loss"] for r in log], abs=1e-6)
    assert not torch.allclose(flat(*clients), flat(*detached), atol=1e-5, rtol=0)    # λ = 0.5 matters here
    assert torch.allclose(flat(*[engine.edge.instances[(None, j)] for j in range(CUT, 11)]),
                          flat(server), atol=1e-5, rtol=0)
    for i in range(S):
        assert torch.allclose(flat(engine.devices[i].blocks), flat(clients[i]), atol=1e-5, rtol=0)


def test_gapsl_with_the_papers_per_role_rates_and_momentum_matches_the_reference() -> None:
    """The paper's setting: SGD with momentum 0.9, the client at half the server's rate (0.005 / 0.01), the server
    stepping on the |𝒟_i|-weighted terms of eq. (8) — each role with its own optimizer (--client-lr / --server-lr)."""
    data, rounds, total = make_data(S, "dirichlet"), 4, 4
    engine = SplitEngine(small_model(), [CUT] * S, GAPSL(k_min=0.25, k_max=0.75, eta_th=0.5), data,
                         OptimizerSpec("sgd", LR / 2, 0.9), batch_size=B, seed=0, total_rounds=total,
                         server_optimizer=OptimizerSpec("sgd", LR, 0.9))
    for t in range(1, rounds + 1):
        engine.run_round(t)
    clients, server, log = reference_gapsl(data, rounds, total, 0.25, 0.75, 0.5, client=HandSGD(LR / 2, 0.9),
                                           server_opt=HandSGD(LR, 0.9))
    assert any(len(r["aligned"]) < S for r in log)
    assert torch.allclose(flat(*[engine.edge.instances[(None, j)] for j in range(CUT, 11)]),
                          flat(server), atol=1e-5, rtol=0)
    for i in range(S):
        assert torch.allclose(flat(engine.devices[i].blocks), flat(clients[i]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", ["detached", "gradient_step", "double_backprop"])
def test_plain_update_of_the_excluded_devices_matches_the_reference(mode: str) -> None:
    """excluded_update = plain: every device steps, those outside Ŝ on their own ∂L_i/∂a_i (from the server pass
    run again after the selection, at the pre-update w_s; in double_backprop mode from its per-device passes)."""
    data, rounds = make_data(S, "dirichlet"), 3
    engine = make_gapsl_engine(data, rounds, k_min=0.25, k_max=0.75, eta_th=0.5, gda=mode, gda_lambda=0.5,
                               excluded_update="plain")
    before = [flat(d.blocks) for d in engine.devices]
    for t in range(1, rounds + 1):
        engine.run_round(t)
    clients, server, log = reference_gapsl(data, rounds, rounds, 0.25, 0.75, 0.5, mode=mode, lam=0.5, excluded="plain")
    assert any(len(r["aligned"]) < S for r in log)
    assert all(not torch.equal(b, flat(d.blocks)) for b, d in zip(before, engine.devices))
    assert torch.allclose(flat(*[engine.edge.instances[(None, j)] for j in range(CUT, 11)]),
                          flat(server), atol=1e-5, rtol=0)
    for i in range(S):
        assert torch.allclose(flat(engine.devices[i].blocks), flat(clients[i]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", ["detached", "gradient_step"])
def test_a_barrier_served_two_devices_at_a_time_matches_the_reference(mode: str, monkeypatch) -> None:
    """excluded_update = plain: the runtime feeds GAPSL's step a part of 2 devices at a time as they forward
    (GradientRowsStep), and the S × P matrix, the selection and the server step are still the whole barrier's (the
    reference's); that each part is answered before the next forwards is test_engine_memory.py's."""
    from trainers import api

    parts: list[int] = []
    serve_part = api.GradientRowsStep.serve_part
    monkeypatch.setattr(api.GradientRowsStep, "serve_part", lambda self, part: parts.append(len(part)) or serve_part(self, part))
    data, rounds = make_data(S, "dirichlet"), 3
    engine = make_gapsl_engine(data, rounds, pass_samples=2 * B, k_min=0.25, k_max=0.75, eta_th=0.5, gda=mode,
                               gda_lambda=0.5)
    stats = [engine.run_round(t) for t in range(1, rounds + 1)]
    assert parts == [2, 2] * rounds
    clients, server, log = reference_gapsl(data, rounds, rounds, 0.25, 0.75, 0.5, mode=mode, lam=0.5, excluded="plain")
    assert any(len(r["aligned"]) < S for r in log)
    for st, r in zip(stats, log):
        assert st.metrics["aligned"] == len(r["aligned"]) and st.loss == pytest.approx(r["loss"], abs=1e-6)
    assert torch.allclose(flat(*[engine.edge.instances[(None, j)] for j in range(CUT, 11)]),
                          flat(server), atol=1e-5, rtol=0)
    for i in range(S):
        assert torch.allclose(flat(engine.devices[i].blocks), flat(clients[i]), atol=1e-5, rtol=0)


def bn_server_model() -> nn.Sequential:
    """small_model with BatchNorm after the server's convolution (block 6 of 12; the server holds blocks ≥ 6)."""
    m = small_model()
    return nn.Sequential(*m[:7], nn.BatchNorm2d(8), *m[7:])


@pytest.mark.parametrize("with_bn, keep_limit, excluded", [(False, None, "none"), (False, 0, "none"), (True, 0, "none"),
                                                         (False, 0, "plain")])
def test_server_passes_per_round(with_bn: bool, keep_limit: int | None, excluded: str, monkeypatch) -> None:
    """The server runs each device once for its g_i and keeps the cut gradients of that backward (no second pass:
    issue 38, GAPSL counted 1.43× centralized FLOPs with one); past the kept-gradient budget (here 0 numbers) and
    without buffers it runs the |Ŝ| replies once more (one pass of all of them, excluded_update = none), but not
    when every device is answered (excluded_update = plain: the replies hold every cut gradient anyway); with
    BatchNorm it always runs each device exactly once (its running statistics see each device's batch once, A.3.4)."""
    from trainers.roles import passes

    if keep_limit is not None:
        monkeypatch.setattr(passes, "KEEP_CUT_VALUES", keep_limit)
    data = make_data(S, "dirichlet")
    model = bn_server_model() if with_bn else small_model()
    cut = 6
    engine = SplitEngine(model, [cut] * S, GAPSL(k_min=0.25, k_max=0.75, eta_th=0.5, excluded_update=excluded), data,
                         {"lr": LR}, batch_size=B, seed=0, total_rounds=2)
    assert engine.passes.replayable(0) is not with_bn
    first = engine.edge.instances[(None, cut)]
    batches: list[int] = []
    first.register_forward_hook(lambda module, args, out: batches.append(int(args[0].shape[0])))
    stats = engine.run_round(1)
    aligned = int(stats.metrics["aligned"])
    if with_bn:
        assert batches == [B] * S
        bn = engine.edge.instances[(None, 7)]
        assert int(bn.num_batches_tracked) == S
    elif keep_limit == 0 and excluded == "none":
        assert batches == [B] * S + [B * aligned]
    else:
        assert batches == [B] * S
    answered = [d for d in engine.devices if d.step and not torch.equal(flat(d.blocks), flat(small_model()[:cut]))]
    assert len(answered) == (aligned if excluded == "none" else S)


@pytest.mark.parametrize("with_bn, replayed", [(False, False), (False, True), (True, False)])
def test_gradient_rows_and_cut_gradients_are_the_per_device_gradients(with_bn: bool, replayed: bool,
                                                                     monkeypatch) -> None:
    """EdgePasses.gradient_rows: row i is arrival i's g_i flattened in parameter order, with its L_i, as
    per_device_gradients gives them one by one; EdgePasses.cut_gradients then gives each ∂L_i/∂a_i at the same
    (pre-update) w_s: kept from the rows' passes (equal to the per-device values bit for bit, one pass per device
    in all) while they fit the kept-gradient budget or BatchNorm makes a second pass change the statistics, else
    (``replayed``: a budget of 0) from one more pass. It needs one shared w_s."""
    from trainers.roles import passes

    if replayed:
        monkeypatch.setattr(passes, "KEEP_CUT_VALUES", 0)
    model = bn_server_model() if with_bn else small_model()
    engine = SplitEngine(model, [6] * 3, GAPSL(), make_data(3), {"lr": LR}, batch_size=B, seed=0)
    assert engine.passes.replayable(0) is not with_bn
    arrivals = [engine.devices[d].forward(1) for d in (2, 0, 1)]
    ce = lambda d, logits, y: nn.functional.cross_entropy(logits, y)   # noqa: E731
    reference = SplitEngine(model, [6] * 3, GAPSL(), make_data(3), {"lr": LR}, batch_size=B, seed=0)
    per = reference.passes.per_device_gradients([reference.devices[d].forward(1) for d in (2, 0, 1)], ce)
    first = engine.edge.instances[(None, 6)]
    passes: list[int] = []
    first.register_forward_hook(lambda module, args, out: passes.append(int(args[0].shape[0])))
    rows, losses = engine.passes.gradient_rows(arrivals, ce)
    params = engine.edge.parameters(0)
    assert rows.shape == (3, sum(p.numel() for p in params))
    for i, a in enumerate(arrivals):
        assert torch.equal(rows[i], torch.cat([g.reshape(-1) for g in per[a.device][0]]))
        assert torch.equal(losses[i], per[a.device][2].detach())
    cut = engine.passes.cut_gradients(arrivals[:2], ce)
    assert set(cut) == {2, 0}
    for a in arrivals[:2]:
        if not replayed:
            assert torch.equal(cut[a.device], per[a.device][1])
        else:   # one pass over both: the batched convolution may sum in another order
            assert torch.allclose(cut[a.device], per[a.device][1], rtol=1e-5, atol=1e-8)
    assert passes == [B] * 3 + ([2 * B] if replayed else [])
    assert all(p.grad is None for p in params)
    empty = engine.passes.gradient_rows([], ce)
    assert empty[0].shape == (0, 0) and empty[1] == []
    from trainers.strategies import make_strategy
    copies = SplitEngine(small_model(), [6] * 2, make_strategy("sfl-v1"), make_data(2), {"lr": LR}, batch_size=B)
    with pytest.raises(ValueError, match="device 1 does not pass through device 0's server parameters"):
        copies.passes.gradient_rows([copies.devices[d].forward(1) for d in (0, 1)], ce)


def test_replayable_server_blocks() -> None:
    """A second server pass is harmless without buffers and random layers."""
    from trainers.strategies import make_strategy
    for model, expected in ((small_model(), True), (bn_server_model(), False),
                            (nn.Sequential(*small_model()[:8], nn.Dropout(0.5), *small_model()[8:]), False),
                            (nn.Sequential(*small_model(), nn.Dropout(0.5)), False)):     # in the last block
        engine = SplitEngine(model, [6, 6], make_strategy("psl"), make_data(2), {"lr": LR}, batch_size=B)
        assert engine.passes.replayable(1) is expected
    engine = SplitEngine(bn_server_model(), [8, 8], make_strategy("psl"), make_data(2), {"lr": LR}, batch_size=B)
    assert engine.passes.replayable(0)          # the BatchNorm (block 7) is on the devices


def test_a_diverged_gradient_matrix_is_named() -> None:
    """The angles of eqs. 1–6 need finite g_i whose products g_i·g_j stay finite: a NaN names its device; a
    finite g_i whose squared norm overflows float32 (its entries' sum may overflow too) names the largest."""
    from types import SimpleNamespace

    from trainers.roles.messages import NonFiniteError

    ctx = SimpleNamespace(round=3, total_rounds=5, metrics={}, rng=np.random.default_rng(0))
    for row, device in ((1, 7), (2, 9)):
        flat_rows = torch.ones(3, 4)
        flat_rows[row, 2] = float("nan")
        with pytest.raises(NonFiniteError, match=f"NaN or inf in the server gradient g_i at round 3, device {device}"):
            GAPSL()._select(flat_rows, [5, 7, 9], ctx)
    for big in (2e19, 3e38):                        # 2e19² overflows; 3e38 + 3e38 overflows the row's sum as well
        flat_rows = torch.ones(3, 4)
        flat_rows[2, :2] = big
        assert bool(torch.isfinite(flat_rows).all())
        with pytest.raises(NonFiniteError, match=r"too large for its angles .* at round 3, device 9"):
            GAPSL()._select(flat_rows, [5, 7, 9], ctx)
    flat_rows = torch.ones(3, 4)
    flat_rows[2, 0] = 1e18                          # large, but its products are finite: selected as usual
    aligned, _ = GAPSL()._select(flat_rows, [5, 7, 9], ctx)
    assert aligned and ctx.metrics["aligned"] == len(aligned)


@pytest.mark.parametrize("S", [5, 128, 129, 300])
def test_gram_is_the_full_product(S: int) -> None:
    """gram() fills the upper triangle band by band (128 rows) and mirrors it: rows @ rows.T, exactly symmetric,
    also across bands and with a last band shorter than the others."""
    from trainers.strategies.gapsl import gram

    rows = torch.randn(S, 37, generator=torch.Generator().manual_seed(S), dtype=torch.float64)
    g = gram(rows)
    assert torch.allclose(g, rows @ rows.T, rtol=1e-12, atol=1e-12)
    assert torch.equal(g, g.T)
    assert torch.allclose(gram(rows, block=7), rows @ rows.T, rtol=1e-12, atol=1e-12)


class Unused(nn.Module):
    """A block with a parameter its forward never touches (∂L/∂w = None from autograd)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_gradient_rows_of_unused_parameters_and_of_no_server_block() -> None:
    """A server parameter the loss does not reach has a zero slot in every row; with the cut at L the server
    holds no block: P = 0, and ∂L_i/∂a_i = (softmax(a_i) − Y)/b, the cross-entropy's gradient at the logits."""
    ce = lambda d, logits, y: nn.functional.cross_entropy(logits, y)   # noqa: E731
    model = nn.Sequential(*small_model()[:10], Unused(), small_model()[10])
    engine = SplitEngine(model, [10] * 2, GAPSL(), make_data(2), {"lr": LR}, batch_size=B, seed=0)
    arrivals = [engine.devices[d].forward(1) for d in range(2)]
    rows, _ = engine.passes.gradient_rows(arrivals, ce)
    assert rows.shape == (2, 3 + 10 * 128 + 10) and torch.equal(rows[:, :3], torch.zeros(2, 3))
    assert bool((rows[:, 3:] != 0).any())
    engine = SplitEngine(small_model(), [11] * 2, GAPSL(), make_data(2), {"lr": LR}, batch_size=B, seed=0)
    arrivals = [engine.devices[d].forward(1) for d in range(2)]
    rows, losses = engine.passes.gradient_rows(arrivals, ce)
    cut = engine.passes.cut_gradients(arrivals, ce)
    assert rows.shape == (2, 0)
    for a, loss in zip(arrivals, losses):
        Y = nn.functional.one_hot(a.labels, 10).to(a.tensor.dtype)
        assert torch.allclose(cut[a.device], (torch.softmax(a.tensor, dim=1) - Y) / B, atol=1e-7)
        assert torch.allclose(loss, nn.functional.cross_entropy(a.tensor, a.labels), atol=1e-6)


# ---- the pairing with PSL and the paper's LGI ablations (issue 34) ------------------------------------------------

@pytest.mark.parametrize("mode", ["detached", "gradient_step", "double_backprop"])
def test_gapsl_with_lambda_zero_and_every_device_aligned_is_psl(mode: str, monkeypatch) -> None:
    """GAPSL = PSL + the selection of Ŝ: with λ = 0 and Ŝ = every device (selection patched to take all) its
    server step (|𝒟_i|-weighted over Ŝ, PSL's eq. 4) and its replies (each device its own ∂L_i/∂a_i) are PSL's,
    in the paper's setting (SGD momentum 0.9, client 0.005, server 0.01) and with unequal |𝒟_i|."""
    from trainers.strategies import PSL

    def everyone(self, grads, progress, rng=None):
        return list(range(grads.shape[0])), grads.mean(0), {}

    monkeypatch.setattr(GAPSL, "select", everyone)
    data = make_data(S, "dirichlet")
    assert len({len(p) for p in data.parts}) > 1

    def engine(strategy) -> SplitEngine:
        return SplitEngine(small_model(), [CUT] * S, strategy, data, OptimizerSpec("sgd", 0.005, 0.9), batch_size=B,
                           seed=0, total_rounds=3, server_optimizer=OptimizerSpec("sgd", 0.01, 0.9))

    gapsl, psl = engine(GAPSL(gda=mode, gda_lambda=0.0)), engine(PSL())
    for t in (1, 2, 3):
        a, b = gapsl.run_round(t), psl.run_round(t)
        assert a.loss == pytest.approx(b.loss, abs=1e-6)
    assert torch.allclose(flat(*[gapsl.edge.instances[(None, j)] for j in range(CUT, 11)]),
                          flat(*[psl.edge.instances[(None, j)] for j in range(CUT, 11)]), atol=1e-6, rtol=0)
    for i in range(S):
        assert torch.allclose(flat(gapsl.devices[i].blocks), flat(psl.devices[i].blocks), atol=1e-6, rtol=0), i


def test_non_lgi_leads_with_every_devices_gradient_and_rand_lgi_with_a_random_subset() -> None:
    """Fig. 20's ablations: Non-LGI's g_lead is the mean of all S rows; Rand-LGI's is the mean of ⌈K^t·S⌉ rows
    drawn uniformly without replacement from the run's stream (not the most consistent ones)."""
    g = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.8, 0.2], [0.0, 1.0], [-1.0, 0.0]])
    _, lead, metrics = GAPSL(leader="all", k_min=0.2, k_max=0.2).select(g, 0.5)
    assert torch.allclose(lead, g.mean(0)) and metrics["leaders"] == 5
    _, lgi_lead, _ = GAPSL(k_min=0.4, k_max=0.4).select(g, 0.5)
    draws = set()
    for seed in range(20):
        rng = np.random.default_rng(seed)
        expected = np.sort(np.random.default_rng(seed).choice(5, size=2, replace=False))
        _, lead, metrics = GAPSL(leader="random", k_min=0.4, k_max=0.4).select(g, 0.5, rng)
        assert metrics["leaders"] == 2
        assert torch.allclose(lead, g[torch.as_tensor(expected)].mean(0))
        draws.add(tuple(expected))
    assert len(draws) > 3 and not all(torch.allclose(lgi_lead, g[list(d)].mean(0)) for d in draws)


def test_the_ablations_train_from_the_cli(tmp_path) -> None:
    from adaptplan.cli import main

    for leader in ("all", "random"):
        assert main(["train", "--algorithm", "gapsl", "--leader", leader, "--dataset", "synthetic", "--model", "mlp",
                     "--devices", "3", "--cuts", "1", "--rounds", "2", "--no-progress", "--out",
                     str(tmp_path / leader)]) == 0


@pytest.mark.parametrize("horizon, total, expected", [(0, 5, 3 / 5), (10, 5, 3 / 10), (10, None, 3 / 10), (0, None, 1.0),
                                                       (2, 5, 1.0)])
def test_the_schedule_of_eq_2_runs_over_the_horizon_or_the_runs_rounds(horizon, total, expected) -> None:
    """K^t of eq. (2) grows with t/T: T is --horizon where given (a run that is the first half of a longer one keeps
    the longer one's schedule), else the run's rounds; t/T is capped at 1."""
    from types import SimpleNamespace

    seen = []
    strategy = GAPSL(horizon=horizon)
    strategy.select = lambda grads, progress, rng=None: seen.append(progress) or ([0], grads[0], {})
    ctx = SimpleNamespace(round=3, total_rounds=total, metrics={}, rng=np.random.default_rng(0))
    strategy._select(torch.ones(3, 4), [5, 7, 9], ctx)
    assert seen == [pytest.approx(expected)]


def test_eq5_angles_read_zero_along_the_leader_whatever_the_rounding() -> None:
    """θ_i of rows identical to g_lead is 0 for 200 random float32 rows (the float32 cosine read ~5·10⁻⁴ rad and
    split agreeing rows at eq. 6's threshold); a known angle is kept: [1, 0] to [1, 1] is π/4, [0, 1] to [1, 0] π/2."""
    from trainers.strategies.gapsl import ANGLE_RESOLUTION, angles_to, leader_mean

    for seed in range(200):
        g = torch.randn(1, 50, generator=torch.Generator().manual_seed(seed)).repeat(5, 1)
        theta = angles_to(g, leader_mean(g, torch.arange(5)))
        assert theta.tolist() == [0.0] * 5, seed
    rows = torch.tensor([[1e3, 0.0], [0.0, 1e3]])       # norms of 10³: A.3.3's ε = 1e-12 on them moves no angle
    assert angles_to(rows, torch.tensor([1e3, 1e3], dtype=torch.float64)).tolist() == pytest.approx(
        [math.pi / 4, math.pi / 4], abs=1e-12)
    assert angles_to(rows, torch.tensor([1e3, 0.0], dtype=torch.float64)).tolist() == pytest.approx([0.0, math.pi / 2])
    tilt = 10 * ANGLE_RESOLUTION      # an angle above the resolution stays what it is
    tilted = torch.tensor([[1e3 * math.cos(tilt), 1e3 * math.sin(tilt)]], dtype=torch.float64)
    assert angles_to(tilted, torch.tensor([1e3, 0.0], dtype=torch.float64)).item() == pytest.approx(tilt, rel=1e-3)
    assert leader_mean(torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), torch.tensor([0, 2])).tolist() == [3.0, 4.0]


def test_eq5_takes_only_the_rows_near_the_leader_again_in_float64() -> None:
    """A row along g_lead reads 0 (float64 again); a row at π/4 keeps its float32 angle."""
    from trainers.strategies.gapsl import eq5_angles

    g = torch.randn(60, generator=torch.Generator().manual_seed(3))
    other = torch.randn(60, generator=torch.Generator().manual_seed(4))
    other = other - (other @ g) / (g @ g) * g                      # orthogonal to g
    tilted = g / g.norm() + other / other.norm()                    # at π/4 from g
    rows = torch.stack([g, g, g, tilted])
    theta = eq5_angles(rows, g, torch.arange(3))
    assert theta[:3].tolist() == [0.0, 0.0, 0.0]
    assert theta[3].item() == pytest.approx(math.pi / 4, abs=1e-5)
