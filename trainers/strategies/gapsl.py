"""GAPSL: gradient-aligned parallel split learning (Lin et al., arXiv:2603.18540), written against
docs/algorithms.md GAPSL (Part A).

PSL's layout (client models never aggregated, one shared server model, every device every round),
with a server step chosen by two server-only procedures (no extra communication):

* **LGI** (Algorithm 1): per-device server gradients g_i = ∂L_i/∂w_s (one backward per device,
  A.3.4); pairwise angles θ_ij; consistency score θ_i (eq. 1); dispersion ν = std_i θ_i with running
  ν_min, ν_max; leader fraction K^t = K_min + (t/T)·stab·(K_max − K_min) (eq. 2), stab =
  (ν_max − ν)/(ν_max − ν_min) (1 when ν_max = ν_min); the ⌈K^t·S⌉ devices of smallest θ_i lead
  (eq. 3); g_lead is their mean (eq. 4).
* **GDA** (Algorithm 2): θ_lead,i = ∠(g_i, g_lead) (eq. 5); threshold θ_th = max(min(μ − η_th·σ, π/2), 0)
  over all devices (eq. 6); the aligned set Ŝ = {θ_lead,i ≤ θ_th} (the device of smallest angle if
  empty); loss L_g = Σ_{Ŝ} [L_i + λ(1 − cos θ_lead,i)] (eqs. 7–8).

GDA modes (A.3.1): ``detached`` (default; the paper's implementation, in which the λ term is a
constant, so the server step is over the g_i of Ŝ); ``double_backprop`` (exact eq. 7: g_i built with a
graph, L_g back-propagated to w_s and to the activations); ``gradient_step`` (g̃_i = g_i − λ·∂(1 − cos)/∂g_i).

**How the server step is scaled** (``server_step``; docs/algorithms.md "GAPSL's pairing with PSL"): ``mean``
(default) weighs eq. (8)'s terms by |𝒟_i|/Σ_{Ŝ}|𝒟_j|, PSL's own rule (eq. 4), so that the paper's one server
rate means the same step for GAPSL and its PSL baseline and GAPSL with λ = 0 and Ŝ = every device *is* PSL;
``sum`` is eq. (8) written literally (a step |Ŝ| times PSL's at the same rate). **Devices outside Ŝ**
(``excluded_update``): ``plain`` (default) — each gets its own cut gradient ∂L_i/∂a_i, as §III-A says ("the
server sends all generated gradients to the client device for updating their respective client-side
models"); ``none`` — no update that round (the spec's literal reading of eq. 8, A.3.2).

**The paper's LGI ablations** (Fig. 20, ``leader``): ``lgi`` (eqs. 1–3), ``all`` (Non-LGI: the leader
gradient is the mean of every device's, no filtering), ``random`` (Rand-LGI: a uniformly random subset of
the same ⌈K^t·S⌉ devices, from the run's strategy stream). T is the run's number of rounds. All devices must
share one cut (the g_i must live in one space). Evaluation: mean over devices of [w_{c,i}; w_s] (A.3.5).
Per-round metrics: K^t, |Ŝ|, the mean pairwise angle (A.3.6).

Memory (``detached`` and ``gradient_step``): the round holds one S × P matrix of the g_i, each written
into its row as its device's pass ends (:meth:`EdgePasses.gradient_rows`); the angles come from its
Gram products and norms, g_lead and the server step from weighted sums of its rows, so no part of
it is copied. With ``excluded_update = plain`` each reply is the device's own ∂L_i/∂a_i at the pre-update w_s,
taken from the backward that gave its g_i and final whatever Ŝ turns out to be, so the runtime may serve the
barrier a part at a time as the devices forward (the API's :class:`~trainers.api.GradientRowsStep`, :meth:`GAPSL.barrier_step`): a round
then holds the matrix and one part's activations and replies, whatever N. With ``none`` the replies (Ŝ's alone)
come from the runtime after the selection (:meth:`EdgePasses.cut_gradients`: kept from the per-device passes
when few; else one more server pass over the devices answered where that is harmless). The results equal the
per-device formulas up to float rounding (tests/trainers/strategies/test_gapsl.py). ``double_backprop`` keeps
every device's g_i with its graph, as eq. (7) needs.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from trainers.api import (
    Activation,
    BarrierStep,
    CutGradient,
    GradientRowsStep,
    InputError,
    ModelViews,
    NonFiniteError,
    RoundContext,
    ServerPasses,
    Strategy,
    answer,
    mean_ce,
    serve_in_passes,
    skip,
)

EPS = 1e-12
ANGLE_RESOLUTION = 1e-6   # rad: eq. (5)'s angles below it read 0 (angles_to)
NEAR_LEAD = 1e-2          # rad: eq. (5)'s angles below it in float32 are taken again in float64 (eq5_angles)
GRAM_BLOCK = 128   # rows per band of gram(): 128 was the fastest of 32–256 for 1,000 × 187,914 on one CPU thread


def angles(vectors: torch.Tensor, others: torch.Tensor | None = None) -> torch.Tensor:
    """arccos of the cosine between every row of ``vectors`` and every row of ``others`` (default:
    ``vectors`` itself; radians; cosine clamped to [−1, 1], norms guarded by a small epsilon, A.3.3):
    the dot products over the products of the norms, so no normalised copy of the S × P matrices is
    made."""
    norm = vectors.norm(dim=1) + EPS
    if others is None:
        dots, other_norm = gram(vectors), norm
    else:
        dots, other_norm = vectors @ others.T, others.norm(dim=1) + EPS
    return torch.arccos((dots / torch.outer(norm, other_norm)).clamp(-1.0, 1.0))


def eq5_angles(rows: torch.Tensor, lead: torch.Tensor, leaders: torch.Tensor) -> torch.Tensor:
    """Eq. (5)'s θ_i in the rows' precision (S·P multiply–adds), the rows within :data:`NEAR_LEAD` rad of g_lead
    again in float64 (:func:`angles_to`): float32 reads identical rows ~5·10⁻⁴ rad apart, which moves them across
    eq. (6)'s threshold; real gradients are rarely that close, so the float64 pass costs nothing as a rule."""
    theta = angles(rows, lead[None, :])[:, 0].double()
    near = torch.nonzero(theta < NEAR_LEAD).flatten()
    if len(near):
        theta[near] = angles_to(rows[near], leader_mean(rows, leaders))
    return theta


def leader_mean(rows: torch.Tensor, leaders: torch.Tensor, block: int = GRAM_BLOCK) -> torch.Tensor:
    """Eq. (4)'s g_lead in float64, summed ``block`` leader rows at a time (for :func:`angles_to`)."""
    total = torch.zeros(rows.shape[1], dtype=torch.float64, device=rows.device)
    for start in range(0, len(leaders), block):
        total += rows[leaders[start:start + block]].double().sum(0)
    return total / len(leaders)


def angles_to(rows: torch.Tensor, lead: torch.Tensor, block: int = GRAM_BLOCK) -> torch.Tensor:
    """Eq. (5)'s θ_i: the angle of every row of ``rows`` to ``lead`` (float64), computed in float64 ``block`` rows at
    a time (S·P multiply–adds; the rows are not copied whole). In float32 a row identical to g_lead reads an angle of
    about √(2·2⁻²³) ≈ 5·10⁻⁴ rad instead of 0, and g_lead itself is off by rounding: enough to move rows across
    eq. (6)'s threshold when all rows agree. An angle below :data:`ANGLE_RESOLUTION` reads 0 (float64's arccos
    near a cosine of 1 resolves about 2·10⁻⁸ rad): rows along g_lead are aligned whatever the rounding."""
    lead64 = lead.double()
    lead_norm = lead64.norm() + EPS
    out = torch.empty(rows.shape[0], dtype=torch.float64, device=rows.device)
    for start in range(0, rows.shape[0], block):
        band = rows[start:start + block].double()
        out[start:start + block] = torch.arccos(((band @ lead64) / ((band.norm(dim=1) + EPS) * lead_norm)).clamp(-1, 1))
    return torch.where(out < ANGLE_RESOLUTION, 0.0, out)


def gram(rows: torch.Tensor, block: int = GRAM_BLOCK) -> torch.Tensor:
    """rows @ rows.T from its upper triangle, computed in bands of ``block`` rows and mirrored: about
    half the S²·P multiply–adds of the full product once S is several blocks (exactly symmetric)."""
    S = rows.shape[0]
    upper = torch.zeros(S, S, dtype=rows.dtype, device=rows.device)
    for start in range(0, S, block):
        upper[start:start + block, start:] = rows[start:start + block] @ rows[start:].T
    upper = upper.triu()                   # each band's square also holds a few products below the diagonal
    return upper + upper.triu(1).T


class GAPSL(Strategy):
    name = "gapsl"
    server_step = "own"              # its own serve (the module docstring's server step)
    averages_clients = False
    uses_total_rounds = True     # K^t of eq. (2) grows with t/T

    def __init__(self, participation: float = 1.0, gda: str = "detached", k_min: float = 0.2, k_max: float = 0.8,
                 eta_th: float = 0.5, gda_lambda: float = 5e-4, excluded_update: str = "plain",
                 server_step: str = "mean", leader: str = "lgi", horizon: int = 0) -> None:
        super().__init__(participation)
        if k_max < k_min:                 # each in its limits (the registry's); together K_min ≤ K_max (eq. 2)
            raise InputError(f"must be in [K_min = {k_min}, 1], got {k_max!r}", field="--k-max")
        self.gda, self.k_min, self.k_max, self.eta_th, self.lam = gda, k_min, k_max, eta_th, gda_lambda
        # the option --server-step weighs eq. (8)'s terms; the class trait server_step = "own" says who serves
        self.excluded_update, self.term_weighting, self.leader = excluded_update, server_step, leader
        self.horizon = int(horizon)      # T of eq. (2); 0: the run's rounds
        self.nu_min, self.nu_max = math.inf, -math.inf

    def validate(self, ctx) -> None:
        if ctx.num_devices < 2:
            raise InputError("GAPSL compares devices' gradients (eq. 1): it needs at least 2 devices", field="devices")
        if len(set(ctx.cuts)) > 1:
            raise InputError(f"GAPSL needs one cut for all devices (their server gradients are compared), got "
                             f"{sorted(set(ctx.cuts))}", field="cuts")

    # ---- LGI and GDA on a matrix of flattened server gradients (rows = devices) -----------------------
    def leader_fraction(self, nu: float, progress: float) -> float:
        """Eq. (2) after updating the running ν_min, ν_max with this round's ν."""
        self.nu_min, self.nu_max = min(self.nu_min, nu), max(self.nu_max, nu)
        span = self.nu_max - self.nu_min
        stab = 1.0 if span < 1e-12 else (self.nu_max - nu) / span
        return self.k_min + progress * stab * (self.k_max - self.k_min)

    def select(self, grads: torch.Tensor, progress: float,
               rng: np.random.Generator | None = None) -> tuple[list[int], torch.Tensor, dict[str, float]]:
        """LGI + GDA: (positions in Ŝ, g_lead, metrics) for S flattened gradients (the rows of ``grads``);
        ``rng`` draws Rand-LGI's leaders."""
        S = grads.shape[0]
        pairwise = angles(grads)
        score = (pairwise.sum(1) - pairwise.diagonal()) / (S - 1)               # eq. (1)
        k = self.leader_fraction(float(score.std(unbiased=False)), progress)   # eq. (2)
        n_sel = math.ceil(k * S - 1e-9)
        if self.leader == "all":                                                  # Non-LGI (Fig. 20)
            n_sel, leaders = S, torch.arange(S, device=grads.device)
        elif self.leader == "random":                                             # Rand-LGI (Fig. 20)
            assert rng is not None, "Rand-LGI draws from the run's strategy stream"
            leaders = torch.as_tensor(np.sort(rng.choice(S, size=n_sel, replace=False)), device=grads.device)
        else:
            leaders = torch.argsort(score, stable=True)[:n_sel]                   # eq. (3)
        lead = (_indicator(S, leaders, grads) / n_sel) @ grads                    # eq. (4), no copy of the rows
        theta = eq5_angles(grads, lead, leaders)                                  # eq. (5)
        th = max(min(float(theta.mean()) - self.eta_th * float(theta.std(unbiased=False)), math.pi / 2), 0.0)  # (6)
        aligned = [i for i in range(S) if float(theta[i]) <= th] or [int(torch.argmin(theta))]
        off_diag = pairwise[~torch.eye(S, dtype=torch.bool, device=pairwise.device)]
        metrics = {"leader_fraction": k, "leaders": float(n_sel), "aligned": float(len(aligned)),
                   "mean_pairwise_angle": float(off_diag.mean())}
        return aligned, lead, metrics

    def barrier_step(self, edge: ServerPasses, ctx: RoundContext, devices: Sequence[int]) -> BarrierStep | None:
        """With ``excluded_update = plain`` every device's reply is its own ∂L_i/∂a_i at the pre-update w_s, whatever
        Ŝ turns out to be, so the barrier may be served in parts (:class:`GradientRowsStep`; ``detached`` and
        ``gradient_step`` GDA); ``none`` answers Ŝ alone and ``double_backprop`` needs every graph: None."""
        return self._rows_step(edge, ctx, devices) if self.answers_each_alone else None

    def _rows_step(self, edge: ServerPasses, ctx: RoundContext, devices: Sequence[int]) -> GradientRowsStep:
        """The barrier's g_i rows and replies, then LGI, GDA and the server step on the whole matrix (eqs. 1–8)."""
        def step_on(flat: torch.Tensor, order: list[int]) -> None:
            aligned, lead = self._select(flat, order, ctx)
            self.add_server_gradient(edge, ctx, flat, order, aligned, lead)
            edge.step(edge.owners(order))
            self.charge(ctx, order[0], flat.shape, [])     # no double backprop in parts: the algebra alone
        return GradientRowsStep(edge, ctx, devices, _loss, step_on)

    @property
    def answers_each_alone(self) -> bool:
        """Whether each reply is the device's own ∂L_i/∂a_i at the pre-update w_s (:meth:`barrier_step`)."""
        return self.excluded_update == "plain" and self.gda != "double_backprop"

    def serve(self, edge: ServerPasses, ctx: RoundContext, arrivals: Sequence[Activation]) -> list[CutGradient]:
        if self.answers_each_alone:                                              # the whole barrier, its parts in turn
            return serve_in_passes(edge, self._rows_step(edge, ctx, [a.device for a in arrivals]), arrivals)
        if self.gda == "double_backprop":
            return self._serve_double_backprop(edge, ctx, arrivals)
        devices = [a.device for a in arrivals]                                    # excluded_update = none
        flat, losses = edge.gradient_rows(arrivals, _loss)                        # g_i and L_i (A.3.4)
        for d, loss in zip(devices, losses):
            ctx.record_loss(d, loss)
        aligned, lead = self._select(flat, devices, ctx)
        cut = edge.cut_gradients([arrivals[i] for i in aligned], _loss)           # ∂L_i/∂a_i at w_s^{t−1}, Ŝ only
        self.add_server_gradient(edge, ctx, flat, devices, aligned, lead)
        return self._step_and_reply(edge, ctx, arrivals, aligned, flat.shape, cut)

    def add_server_gradient(self, edge: ServerPasses, ctx: RoundContext, flat: torch.Tensor, devices: Sequence[int],
                            aligned: Sequence[int], lead: torch.Tensor) -> None:
        """Eq. (8)'s server gradient from the S × P matrix (:meth:`server_gradient`, :meth:`term_weights`), added
        to w_s's."""
        params = edge.parameters(devices[0])
        weights = self.term_weights(ctx, [devices[i] for i in aligned])
        edge.add_gradients(params, _unflatten(self.server_gradient(flat, aligned, lead, weights), params))

    def _step_and_reply(self, edge: ServerPasses, ctx: RoundContext, arrivals: Sequence[Activation],
                        aligned: Sequence[int], shape: torch.Size, cut: dict[int, torch.Tensor]) -> list[CutGradient]:
        """Step w_s (its gradient added), charge the round's extra server work (:meth:`charge`) and reply:
        each device in ``cut`` its cut gradient, the others a skip (no update, A.3.2)."""
        edge.step(edge.owners([a.device for a in arrivals]))
        self.charge(ctx, arrivals[0].device, shape, [arrivals[i].batch_size for i in aligned])
        return [answer(a, cut[a.device]) if a.device in cut else skip(a) for a in arrivals]

    def _select(self, flat: torch.Tensor, devices: Sequence[int], ctx: RoundContext) -> tuple[list[int], torch.Tensor]:
        """LGI + GDA on the round's S × P gradient matrix (after checking it is finite): positions in Ŝ
        and g_lead; the round's metrics recorded."""
        if not bool(torch.isfinite(flat.sum())):   # the angles of eqs. 1-6 are undefined: a diverged run, said as one
            bad = [i for i in range(len(devices)) if not bool(torch.isfinite(flat[i]).all())]
            if bad:
                raise NonFiniteError(f"NaN or inf in the server gradient g_i at round {ctx.round}, device {devices[bad[0]]}")
        norms = flat.norm(dim=1)
        largest = int(torch.argmax(norms))
        # every product g_i·g_j of the angles is at most ‖g_i‖·‖g_j‖ ≤ max ‖g‖², finite when that is (torch sums a
        # norm's squares in flat's dtype, so the norm itself is already inf there; the square says what is needed)
        if not bool(torch.isfinite(norms[largest] * norms[largest])):
            raise NonFiniteError(f"the server gradient g_i is too large for its angles (its squared norm overflows "
                                 f"{flat.dtype}) at round {ctx.round}, device {devices[largest]}")
        horizon = self.horizon or ctx.total_rounds
        progress = ctx.round / horizon if horizon else 1.0
        aligned, lead, metrics = self.select(flat.detach(), min(progress, 1.0), ctx.rng)
        ctx.metrics.update(metrics)
        return aligned, lead

    def _serve_double_backprop(self, edge: ServerPasses, ctx: RoundContext,
                               arrivals: Sequence[Activation]) -> list[CutGradient]:
        """Eq. (7) exactly: Σ_{Ŝ}[L_i + λ(1 − cos θ_lead,i)] back-propagated through the g_i (kept with
        their graphs) to w_s and to the aligned devices' activations."""
        per = edge.per_device_gradients(arrivals, _loss, create_graph=True)
        devices = [a.device for a in arrivals]
        for d in devices:
            ctx.record_loss(d, per[d][2])
        flat = torch.stack([torch.cat([g.reshape(-1) for g in per[d][0]]) for d in devices])
        aligned, lead = self._select(flat, devices, ctx)
        params = edge.parameters(devices[0])
        chosen = [devices[i] for i in aligned]
        cut = {d: per[d][1] for d in devices} if self.excluded_update == "plain" else {}
        lead_dir = lead / (lead.norm() + EPS)
        weights = self.term_weights(ctx, chosen)
        total = sum(w * (per[devices[i]][2] + self.lam * (1 - (flat[i] @ lead_dir) / (flat[i].norm() + EPS)))
                    for w, i in zip(weights, aligned))
        grads = torch.autograd.grad(total, params + [per[d][3] for d in chosen])
        edge.add_gradients(params, grads[:len(params)])
        cut.update((d, g / w) for d, g, w in zip(chosen, grads[len(params):], weights))   # each device's own ∂/∂a_i
        return self._step_and_reply(edge, ctx, arrivals, aligned, flat.shape, cut)

    def charge(self, ctx, device: int, shape: torch.Size, aligned_batches: list[int]) -> None:
        """Server work beyond PSL's one forward+backward per arrival (the S per-device passes of A.3.4 cost
        the same FLOPs as one pass over all arrivals, and the runtime charges that): the LGI/GDA algebra on
        the S×P matrix of flattened gradients (spec A.7: the S² pairwise products for eq. 1, S products with
        g_lead for eq. 5 and S rows for eq. 4, (S² + 2S)·P multiply–adds, 2 FLOPs each); in ``double_backprop`` mode the
        back-propagation through every aligned device's gradient graph, charged as two more forward+backward
        passes of its batch (a Hessian-vector product costs about two gradients)."""
        S, P = int(shape[0]), int(shape[1])
        extra = 2.0 * sum(aligned_batches) if self.gda == "double_backprop" else 0.0
        ctx.charge_server(device, samples=extra, flops=2.0 * (S * S + 2 * S) * P)

    def term_weights(self, ctx: RoundContext, chosen: Sequence[int]) -> list[float]:
        """The weight of each aligned device's term of eq. (8) (``server_step``): ``mean`` |𝒟_i|/Σ_{Ŝ}|𝒟_j|
        (PSL's eq. 4 over Ŝ), ``sum`` 1 (eq. 8 literally)."""
        if self.term_weighting == "sum":
            return [1.0] * len(chosen)
        total = sum(float(ctx.data_sizes[d]) for d in chosen)
        return [float(ctx.data_sizes[d]) / total for d in chosen]

    def server_gradient(self, flat: torch.Tensor, aligned: Sequence[int], lead: torch.Tensor,
                        weights: Sequence[float] | None = None) -> torch.Tensor:
        """The server step's gradient from the S × P matrix, as weights on its rows (no copy of them), each
        aligned row weighted by ``weights`` (:meth:`term_weights`; default 1). ``detached``: Σ_{Ŝ} w_i·g_i.
        ``gradient_step``: Σ_{Ŝ} w_i·g̃_i with g̃ = g − λ·∂(1 − cos(g, g_lead))/∂g, where
        ∂(1−cos)/∂g = −(ĝ_lead − cos·ĝ)/‖g‖ and ĝ = g/‖g‖:
        Σ_{Ŝ} w_i·g_i·(1 − λ·cos_i/‖g_i‖²) + λ·ĝ_lead·Σ_{Ŝ} w_i/‖g_i‖ (norms guarded by the epsilon of A.3.3)."""
        index = torch.as_tensor(list(aligned), device=flat.device)
        w = torch.ones(len(aligned), dtype=flat.dtype, device=flat.device) if weights is None \
            else torch.as_tensor(list(weights), dtype=flat.dtype, device=flat.device)
        rows = torch.zeros(flat.shape[0], dtype=flat.dtype, device=flat.device)
        if self.gda != "gradient_step":
            rows[index] = w
            return rows @ flat
        norms = (flat.norm(dim=1) + EPS)[index]
        lead_hat = lead / (lead.norm() + EPS)
        cos = (flat @ lead_hat)[index] / norms
        rows[index] = w * (1.0 - self.lam * cos / norms**2)
        return rows @ flat + self.lam * (w / norms).sum() * lead_hat

    def eval_models(self, view: ModelViews) -> list[nn.Module]:
        return [view.device_model(d) for d in range(view.num_devices)]

    def state_dict(self) -> dict[str, Any]:
        return {"nu_min": self.nu_min, "nu_max": self.nu_max}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.nu_min, self.nu_max = float(state["nu_min"]), float(state["nu_max"])


def _loss(device: int, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """L_i: device i's mean cross-entropy on its batch."""
    return mean_ce(logits, labels)


def _indicator(size: int, index: torch.Tensor | Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """A vector of ``size`` zeros with ones at ``index`` (``like``'s dtype and device): weights on the
    rows of an S × P matrix, whose product with it sums the chosen rows without copying them."""
    out = torch.zeros(size, dtype=like.dtype, device=like.device)
    out[torch.as_tensor(index, device=like.device)] = 1.0
    return out


def _unflatten(vector: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    out, start = [], 0
    for p in like:
        out.append(vector[start:start + p.numel()].view_as(p))
        start += p.numel()
    return out
