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
constant, so the server step is Σ_{Ŝ} g_i and the cut gradients ∂L_i/∂a_i for i ∈ Ŝ);
``double_backprop`` (exact eq. 7: g_i built with a graph, Σ_{Ŝ}(L_i + reg_i) back-propagated to
w_s and to the activations); ``gradient_step`` (g̃_i = g_i − λ·∂(1 − cos)/∂g_i, server step Σ_{Ŝ} g̃_i).
Devices outside Ŝ get no update (``excluded_update="none"``, the literal reading, A.3.2) or their
own cut gradient (``"plain"``). T is the run's number of rounds. All devices must share one cut
(the g_i must live in one space). Evaluation: mean over devices of [w_{c,i}; w_s] (A.3.5).
Per-round metrics: K^t, |Ŝ|, the mean pairwise angle (A.3.6).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import nn

from trainers.api import Activation, CutGradient, InputError, ModelViews, NonFiniteError, RoundContext, ServerPasses, Strategy, answer, mean_ce, skip

EPS = 1e-12


def angles(vectors: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
    """arccos of the cosine between every row of ``vectors`` and every row of ``others`` (radians;
    cosine clamped to [−1, 1], norms guarded by a small epsilon, A.3.3)."""
    a = vectors / (vectors.norm(dim=1, keepdim=True) + EPS)
    b = others / (others.norm(dim=1, keepdim=True) + EPS)
    return torch.arccos((a @ b.T).clamp(-1.0, 1.0))


class GAPSL(Strategy):
    name = "gapsl"
    averages_clients = False
    uses_total_rounds = True     # K^t of eq. (2) grows with t/T

    def __init__(self, participation: float = 1.0, gda: str = "detached", k_min: float = 0.2, k_max: float = 0.8,
                 eta_th: float = 0.5, gda_lambda: float = 5e-4, excluded_update: str = "none") -> None:
        super().__init__(participation)
        if not 0 < k_min <= 1:
            raise InputError(f"must be in (0, 1], got {k_min!r}", field="--k-min")
        if not k_min <= k_max <= 1:
            raise InputError(f"must be in [K_min = {k_min}, 1], got {k_max!r}", field="--k-max")
        if not (eta_th >= 0 and math.isfinite(eta_th)):
            raise InputError(f"must be a finite number ≥ 0, got {eta_th!r}", field="--eta-th")
        if not (gda_lambda >= 0 and math.isfinite(gda_lambda)):
            raise InputError(f"must be a finite number ≥ 0, got {gda_lambda!r}", field="--gda-lambda")
        self.gda, self.k_min, self.k_max, self.eta_th, self.lam = gda, k_min, k_max, eta_th, gda_lambda
        self.excluded_update = excluded_update
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

    def select(self, grads: torch.Tensor, progress: float) -> tuple[list[int], torch.Tensor, dict[str, float]]:
        """LGI + GDA: (positions in Ŝ, θ_lead per device, metrics) for S flattened gradients."""
        S = grads.shape[0]
        pairwise = angles(grads, grads)
        score = (pairwise.sum(1) - pairwise.diagonal()) / (S - 1)               # eq. (1)
        k = self.leader_fraction(float(score.std(unbiased=False)), progress)   # eq. (2)
        n_sel = math.ceil(k * S - 1e-9)
        leaders = torch.argsort(score, stable=True)[:n_sel]                       # eq. (3)
        lead = grads[leaders].mean(0, keepdim=True)                                # eq. (4)
        theta = angles(grads, lead)[:, 0]                                          # eq. (5)
        th = max(min(float(theta.mean()) - self.eta_th * float(theta.std(unbiased=False)), math.pi / 2), 0.0)  # (6)
        aligned = [i for i in range(S) if float(theta[i]) <= th] or [int(torch.argmin(theta))]
        off_diag = pairwise[~torch.eye(S, dtype=torch.bool, device=pairwise.device)]
        metrics = {"leader_fraction": k, "leaders": float(n_sel), "aligned": float(len(aligned)),
                   "mean_pairwise_angle": float(off_diag.mean())}
        return aligned, lead[0], metrics

    def serve(self, edge: ServerPasses, ctx: RoundContext, arrivals: Sequence[Activation]) -> list[CutGradient]:
        create_graph = self.gda == "double_backprop"
        per = edge.per_device_gradients(arrivals, lambda d, logits, y: mean_ce(logits, y), create_graph=create_graph)
        devices = [a.device for a in arrivals]
        for d in devices:
            ctx.record_loss(d, per[d][2])
        flat = torch.stack([torch.cat([g.reshape(-1) for g in per[d][0]]) for d in devices])
        finite = torch.isfinite(flat).all(dim=1)
        if not bool(finite.all()):     # the angles of eqs. 1-6 are undefined: a diverged run, said as one
            bad = devices[int((~finite).nonzero()[0, 0])]
            raise NonFiniteError(f"NaN or inf in the server gradient g_i at round {ctx.round}, device {bad}")
        progress = ctx.round / ctx.total_rounds if ctx.total_rounds else 1.0
        aligned, lead, metrics = self.select(flat.detach(), min(progress, 1.0))
        ctx.metrics.update(metrics)
        params = edge.parameters(devices[0])
        chosen = [devices[i] for i in aligned]
        cut = {d: per[d][1] for d in devices}
        if self.gda == "double_backprop":
            lead_dir = lead / (lead.norm() + EPS)
            total = sum(per[d][2] + self.lam * (1 - (flat[i] @ lead_dir) / (flat[i].norm() + EPS))
                        for i, d in enumerate(devices) if i in aligned)
            inputs = [per[d][3] for d in chosen]
            grads = torch.autograd.grad(total, params + inputs)
            edge.add_gradients(params, grads[:len(params)])
            cut.update(zip(chosen, grads[len(params):]))
        else:
            rows = flat[aligned].detach()
            if self.gda == "gradient_step":
                rows = self.aligned_rows(rows, lead)
            server_grad = rows.sum(0)
            edge.add_gradients(params, _unflatten(server_grad, params))
        edge.step(edge.owners(devices))
        self.charge(ctx, devices[0], flat.shape, [arrivals[i].batch_size for i in aligned])
        replies = []
        for a in arrivals:
            if a.device in chosen or self.excluded_update == "plain":
                replies.append(answer(a, cut[a.device]))
            else:
                replies.append(skip(a))
        return replies

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

    def aligned_rows(self, rows: torch.Tensor, lead: torch.Tensor) -> torch.Tensor:
        """gradient_step mode: g̃ = g − λ·∂(1 − cos(g, g_lead))/∂g, where ∂(1−cos)/∂g = −(ĝ_lead − cos·ĝ)/‖g‖."""
        norms = rows.norm(dim=1, keepdim=True) + EPS
        g_hat, lead_hat = rows / norms, lead / (lead.norm() + EPS)
        cos = (g_hat @ lead_hat)[:, None]
        return rows + self.lam * (lead_hat[None, :] - cos * g_hat) / norms

    def eval_models(self, view: ModelViews) -> list[nn.Module]:
        return [view.device_model(d) for d in range(view.num_devices)]

    def state_dict(self) -> dict[str, Any]:
        return {"nu_min": self.nu_min, "nu_max": self.nu_max}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.nu_min, self.nu_max = float(state["nu_min"]), float(state["nu_max"])


def _unflatten(vector: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    out, start = [], 0
    for p in like:
        out.append(vector[start:start + p.numel()].view_as(p))
        start += p.numel()
    return out
