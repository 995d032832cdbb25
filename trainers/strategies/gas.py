"""GAS: generative activation-aided asynchronous split federated learning (Yang & Liu, AAAI 2025),
written against docs/algorithms.md GAS (Part B). Runs on the runtime's asynchronous loop (no round barrier).

C devices (``--active``) are always training, each on its own simulated clock (latency model per
device and stage); the runtime always advances the device whose activation arrives first (ties:
the first active slot). A device's arrival (A_k, Y_k) (GAS-1) is served as if at once (the runtime may hold
arrivals between two flushes and serve them in one pass, ``defer``: they all meet the same w_s):

* its cut gradient is G_k = ∇_{A_k} ℓ_k with the logit-adjusted loss ℓ_k = −log softmax(s +
  τ·log(P_k + ε))_y at the server weights current at arrival (GAS-9, GAS-10; P_k = device k's label
  distribution, ε = 1e-12); the device steps (GAS-11);
* (A_k, Y_k) joins the activation buffer 𝒜 with weight ω = E·t_k + e_k + 1 (GAS-2, GAS-3: t_k the
  global-model version the device joined with, e_k its 0-based local step). When 𝒜 holds Q_s
  mini-batches (``--buffer``, default C): the per-label statistics absorb 𝒜's real activations
  (GAS-5b batch merge, λ = 1e-5; diagonal covariance by default, full with ``--covariance full``);
  once every label has statistics, n̂_y = max(0, B − n_y) activations per label are drawn from
  N(μ_y, Σ_y) (GAS-6, GAS-7; off with ``--generation off``: the asynchronous-SFL ablation); one
  server step on the mean plain CE over real ∪ generated (GAS-8); 𝒜 is emptied.

GAS-8's gradient is a sum over samples divided by |A_concat|, and w_s moves only at a flush, so every buffered
activation arrived at the weights the step differentiates at: where samples never interact in a pass (no
BatchNorm, ``batch_independent``), each real activation's summed plain CE is differentiated at its arrival, from the
forward GAS-10 already ran (the sum held in ``real_sum``), and the flush passes only the generated ones through the
server, so the real activations are not run a second time. The simulated clock still charges GAS-8's pass over all
|A_concat| samples (the algorithm's arithmetic as the paper states it).

After E local steps (``--local-steps``) the device uploads its client model; when Q_c = C models
are buffered the fed server averages them by |𝒟_k| (GAS-12), the global version t advances (one
round of the history = one global iteration), and the finished device's slot goes to a device
drawn uniformly from the idle ones, which downloads the current global client model.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from trainers.api import (
    Activation,
    AsyncStrategy,
    CutGradient,
    InputError,
    ModelUpload,
    RoundContext,
    ServerPasses,
    answer,
    is_finite_number,
    is_int,
    label_prior,
    logit_adjusted_ce,
)

REGULARISATION = 1e-5       # λ of GAS-5b, and the diagonal variant's variance floor (GAS-7)


def _count(value: Any) -> bool:
    return is_int(value) and value >= 0


class LabelStatistics:
    """Weighted running mean, (co)variance and weight sum of flattened activations for one label
    (GAS-4/5; the per-flush batch merge GAS-5b)."""

    def __init__(self, full: bool) -> None:
        self.full = full
        self.mean: torch.Tensor | None = None
        self.cov: torch.Tensor | None = None          # (d,) variances, or (d, d) when full
        self.weight = 0.0

    def merge(self, rows: torch.Tensor, weights: torch.Tensor, lam: float = REGULARISATION) -> None:
        """GAS-5b: batch mean/covariance with weights ω, merged into the running statistics."""
        w = weights.double()
        centred = rows.double()                # a copy of its own: centred in place
        total = float(w.sum())
        mu_b = (w @ centred) / total           # Σ ω·a / Σ ω as one matrix–vector product (no n × d temporaries)
        centred -= mu_b
        if self.full:
            cov_b = (centred.T * w) @ centred / total
        else:
            cov_b = w @ centred.square_() / total
        if self.mean is None:
            self.mean, self.cov, self.weight = mu_b, cov_b, total
            return
        assert self.cov is not None, "set with the mean"
        d = self.weight / (self.weight + total)
        mu = d * self.mean + (1 - d) * mu_b
        shift_old, shift_new = mu - self.mean, mu - mu_b
        if self.full:
            eye = torch.eye(mu.numel(), dtype=mu.dtype, device=mu.device)
            self.cov = (d * (self.cov + torch.outer(shift_old, shift_old))
                        + (1 - d) * (cov_b + torch.outer(shift_new, shift_new)) + lam * eye)
        else:
            self.cov = d * (self.cov + shift_old ** 2) + (1 - d) * (cov_b + shift_new ** 2) + lam
        self.mean, self.weight = mu, self.weight + total

    def sample(self, z: torch.Tensor) -> torch.Tensor:
        """Draws from N(μ, Σ) (GAS-7), one per row of the standard normals ``z`` (n × d): diagonal σ = √(v + 1e-5);
        full by Cholesky with an εI fallback (ε = 1e-6, ×10 per retry)."""
        assert self.mean is not None and self.cov is not None, "sampled only after a merge"
        z = z.to(self.mean.device, self.mean.dtype)
        if not self.full:
            return (self.mean + z * torch.sqrt(self.cov + REGULARISATION)).float()
        eps = 1e-6
        for _ in range(100):
            chol, info = torch.linalg.cholesky_ex(self.cov + eps * torch.eye(self.mean.numel(), dtype=self.cov.dtype,
                                                                             device=self.cov.device))
            if int(info) == 0:
                return (self.mean + z @ chol.T).float()
            eps *= 10
        raise RuntimeError("GAS: covariance not positive definite after 100 regularisation steps")


def standard_normals(rows: int, dim: int, rng: np.random.Generator) -> torch.Tensor:
    """``rows`` × ``dim`` standard normals (float32, on the CPU) for one flush's draws (GAS-7), from one seed taken
    off the strategy stream ``rng``: torch's CPU generator fills them several times faster than numpy's float64
    draws, which took 16 % of a VGG-16 global iteration on a GPU (d = 65,536 at cut 1); drawn on the CPU whatever the
    run's device, so that a CPU run and a CUDA run of one seed draw the same numbers."""
    generator = torch.Generator().manual_seed(int(rng.integers(2 ** 63)))
    return torch.randn((rows, dim), generator=generator)


def summed_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Σ CE over the samples: GAS-8's numerator for the real activations of one arrival."""
    return nn.functional.cross_entropy(logits, labels, reduction="sum")


def flush_flops(real: int, dim: int, generated: list[int], full: bool) -> float:
    """FLOPs (2 per multiply–add, the profiles' convention) of one flush outside the server model
    (docs/algorithms.md "What the clock charges"): statistics of ``real`` flattened activations of ``dim``
    values (GAS-5b: weighted mean, centring and weighted squares, 3·n·d multiply–adds diagonal; n·d·(d + 1)
    full, the outer products) and the draws (GAS-7: n̂·d diagonal; per label drawn, a Cholesky factorisation
    d³/3 and n̂_y·d² full). ``generated`` holds n̂_y per label drawn."""
    if not full:
        return 2.0 * (3.0 * real * dim + sum(generated) * dim)
    return 2.0 * (real * dim * (dim + 1.0) + sum(dim ** 3 / 3.0 + n * dim ** 2 for n in generated))


class GAS(AsyncStrategy):
    name = "gas"
    server_step = "own"              # its own serve (the module docstring's server step)

    reset_client_optimizer = True    # a joining device starts from w_c^glob with fresh optimizer state
    optional_state = frozenset({"real_sum", "summed"})

    def __init__(self, active: int = 0, local_steps: int = 20, buffer: int = 0, generation: str = "on",
                 covariance: str = "diag", la_tau: float = 1.0) -> None:
        super().__init__()
        self.active, self.local_steps, self.buffer_size = active, local_steps, buffer
        self.generation, self.full, self.tau = generation == "on", covariance == "full", float(la_tau)
        self.buffer: list[tuple[torch.Tensor, torch.Tensor, float]] = []
        self.models: list[Any] = []
        self.stats: dict[int, LabelStatistics] = {}
        self.version = 0
        self.join: dict[int, int] = {}
        self.local: dict[int, int] = {}
        self.server_updates = 0
        self.real_sum: list[torch.Tensor] | None = None
        """Σ ∂CE(w_s; a, y)/∂w_s over the real samples of the last ``summed`` buffered activations (GAS-8's real part,
        differentiated at arrival; None when ``summed`` is 0)."""
        self.summed = 0

    def validate(self, ctx) -> None:
        if len(set(ctx.cuts)) > 1:
            raise InputError(f"GAS buffers and generates activations of one shape: it needs one cut for all devices, "
                             f"got {sorted(set(ctx.cuts))}", field="cuts")

    def capacity(self, ctx) -> int:
        """Q_s = Q_c = C (capped at the number of devices) unless ``--buffer`` sets Q_s."""
        return self.buffer_size or min(self.active, ctx.num_devices)

    def first_devices(self, ctx: RoundContext) -> list[int]:
        self.active = self.active_count(ctx)
        first = super().first_devices(ctx)
        for d in first:
            self.join[d], self.local[d] = 0, 0
        return first

    def replace(self, ctx: RoundContext, finished: int, active: Sequence[int]) -> int:
        new = super().replace(ctx, finished, active)
        self.join[new], self.local[new] = self.version, 0
        return new

    def defer(self, edge: ServerPasses, ctx: RoundContext, waiting: Sequence[Activation]) -> bool:
        """Arrivals wait to be served in one pass while none of them fills 𝒜 (w_s moves only at a flush, so they all
        meet the weights they would have met at once) and samples never interact in a pass (the pass is
        split per sample only then: ``batch_independent``)."""
        return edge.batch_independent and len(self.buffer) + len(waiting) < self.capacity(ctx)

    def serve(self, edge: ServerPasses, ctx: RoundContext, arrivals: Sequence[Activation]) -> list[CutGradient]:
        """The arrivals in order: each answered at the server weights current at its arrival (GAS-10) and buffered
        (GAS-2/3), 𝒜 flushed whenever it holds Q_s (GAS-5b–8). Arrivals between two flushes share those weights:
        they run as one pass where samples never interact."""
        replies: list[CutGradient] = []
        while len(replies) < len(arrivals):
            room = max(1, self.capacity(ctx) - len(self.buffer))     # 𝒜 holds Q_s or more only if restored so
            part = arrivals[len(replies):len(replies) + room]
            replies += self._serve_at_one_weight(edge, ctx, part)
            if len(self.buffer) >= self.capacity(ctx):
                self.flush_buffer(edge, ctx, part[-1].device)
        return replies

    def _serve_at_one_weight(self, edge: ServerPasses, ctx: RoundContext,
                             arrivals: Sequence[Activation]) -> list[CutGradient]:
        """GAS-9/10 replies to ``arrivals``, all at the current w_s, and their entries of 𝒜 (GAS-2/3)."""
        def adjusted(device: int, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            loss = logit_adjusted_ce(logits, labels, label_prior(ctx.label_counts[device]), self.tau)     # GAS-9
            ctx.record_loss(device, loss)
            return loss

        if edge.batch_independent:
            grads, real = edge.arrival_gradients(arrivals, adjusted, summed_ce)                  # GAS-10; GAS-8's real part
            self.real_sum = real if self.real_sum is None else [s + g for s, g in zip(self.real_sum, real)]
            self.summed += len(arrivals)
        else:
            grads = {}
            for a in arrivals:
                p = edge.run([a])
                grads[a.device] = p.cut_gradients(adjusted(a.device, p.logits[a.device], a.labels))[a.device]  # GAS-10
        for a in arrivals:
            omega = self.local_steps * self.join.get(a.device, 0) + self.local.get(a.device, 0) + 1  # GAS-3
            self.local[a.device] = self.local.get(a.device, 0) + 1
            self.buffer.append((a.tensor.detach(), a.labels, float(omega)))                      # GAS-2
        return [answer(a, grads[a.device]) for a in arrivals]

    def flush_buffer(self, edge, ctx, device: int) -> None:
        """Statistics (GAS-5b), generation (GAS-6/7) and one server step (GAS-8); empties 𝒜."""
        shape = self.buffer[0][0].shape[1:]
        rows = torch.cat([x.reshape(x.shape[0], -1) for x, _, _ in self.buffer])
        labels = torch.cat([y for _, y, _ in self.buffer])
        weights = torch.cat([torch.full((y.shape[0],), w, device=rows.device) for _, y, w in self.buffer])
        for y in labels.unique().tolist():
            mask = labels == y
            self.stats.setdefault(int(y), LabelStatistics(self.full)).merge(rows[mask], weights[mask])
        unsummed = sum(int(y.shape[0]) for _, y, _ in self.buffer[:len(self.buffer) - self.summed])
        features, targets = [rows[:unsummed]], [labels[:unsummed]]    # the real rows not differentiated at arrival
        generated = 0
        if self.generation and len(self.stats) == ctx.num_classes:
            counts = torch.bincount(labels, minlength=ctx.num_classes).tolist()
            wanted = {y: ctx.batch_size - n for y, n in enumerate(counts) if n < ctx.batch_size}   # GAS-6: n̂_y > 0
            if wanted:
                z = standard_normals(sum(wanted.values()), rows.shape[1], ctx.rng).to(rows.device)
                for (y, n), z_y in zip(wanted.items(), z.split(list(wanted.values()))):
                    features.append(self.stats[y].sample(z_y))                                   # GAS-7
                    targets.append(torch.full((n,), y, dtype=labels.dtype, device=labels.device))
                    generated += n
        total = rows.shape[0] + generated                                                       # |A_concat|
        if self.real_sum is not None:                                                           # GAS-8, real part
            edge.add_gradients(edge.parameters(device), [g / total for g in self.real_sum])
        x, target = torch.cat(features).reshape(-1, *shape), torch.cat(targets)
        if x.shape[0]:
            edge.backward_mean_loss(x, target, device, count=total)                             # GAS-8, the rest
        edge.step(edge.owners([device]))
        drawn = [int(t.numel()) for t in targets[1:]]
        ctx.charge_server(device, samples=total, flops=flush_flops(rows.shape[0], rows.shape[1], drawn, self.full))
        self.server_updates += 1
        ctx.metrics["generated"] = ctx.metrics.get("generated", 0.0) + generated
        ctx.metrics["server_updates"] = float(self.server_updates)
        self.buffer, self.real_sum, self.summed = [], None, 0

    def on_model(self, ctx: RoundContext, upload: ModelUpload) -> list[ModelUpload] | None:
        self.models.append(upload)
        if len(self.models) < min(self.active, ctx.num_devices):
            return None
        flushed, self.models = self.models, []
        self.version += 1                                                                       # GAS-12
        return flushed

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": list(self.buffer), "models": list(self.models), "version": self.version,
                "join": dict(self.join), "local": dict(self.local), "updates": self.server_updates,
                "stats": {y: (s.mean, s.cov, s.weight) for y, s in self.stats.items()}, "active": self.active,
                "real_sum": list(self.real_sum) if self.real_sum is not None else None, "summed": self.summed}

    def check_state(self, ctx: RoundContext) -> None:
        """What a checkpoint restored must be for this run (ValueError naming it): counts ≥ 0, at most N active
        devices, the version-at-join and local-step counts of devices of the run, buffered activations as
        (features, labels of 0..M−1, finite weight ≥ 0), the real part of GAS-8's gradient as finite tensors of the last
        1..|𝒜| of them (or none), buffered models as model uploads, statistics finite and,
        after a server update, not empty (GAS-5b merges each update's labels)."""
        n = ctx.num_devices
        if not all(_count(v) for v in (self.version, self.server_updates)) or not _count(self.active) \
                or self.active > n:
            raise ValueError(f"GAS's version, updates and active must be integers ≥ 0 (active at most {n})")
        for name, table in (("join", self.join), ("local", self.local)):
            if not all(0 <= d < n and 0 <= v <= max(self.version, self.local_steps) for d, v in table.items()):
                raise ValueError(f"GAS's {name} must map devices of 0..{n - 1} to counts in 0..{self.version}")
        for item in self.buffer:
            if not (isinstance(item, (tuple, list)) and len(item) == 3 and torch.is_tensor(item[0])
                    and torch.is_tensor(item[1]) and item[0].dim() >= 2 and item[1].dim() == 1
                    and item[0].shape[0] == item[1].shape[0] and item[0].is_floating_point()
                    and not item[1].is_floating_point() and bool(((item[1] >= 0) & (item[1] < ctx.num_classes)).all())
                    and is_finite_number(item[2]) and item[2] >= 0):
                raise ValueError("GAS's buffer must hold (features, labels, weight) of the run's classes")
        summed_ok = (self.real_sum is None and self.summed == 0) or (
            isinstance(self.real_sum, list) and is_int(self.summed) and 1 <= self.summed <= len(self.buffer)
            and all(torch.is_tensor(g) and g.is_floating_point() and bool(torch.isfinite(g).all()) for g in self.real_sum))
        if not summed_ok:
            raise ValueError("GAS's real_sum must be finite gradient tensors of the last `summed` buffered activations "
                             f"(1..{len(self.buffer)}), or None with summed 0")
        if not all(isinstance(m, ModelUpload) for m in self.models):
            raise ValueError("GAS's models must be model uploads")
        if self.server_updates and not self.stats:
            raise ValueError("GAS's statistics cannot be empty after a server update (each update merges its labels')")
        for y, stat in self.stats.items():
            tensors = [t for t in (stat.mean, stat.cov) if t is not None]
            if not 0 <= y < ctx.num_classes or not is_finite_number(stat.weight) or stat.weight < 0 \
                    or not all(torch.is_tensor(t) and bool(torch.isfinite(t).all()) for t in tensors):
                raise ValueError(f"GAS's statistics of label {y} must be finite tensors of a class of the run")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer, self.models = list(state["buffer"]), list(state["models"])
        self.version, self.server_updates = int(state["version"]), int(state["updates"])
        self.join = {int(k): int(v) for k, v in state["join"].items()}
        self.local = {int(k): int(v) for k, v in state["local"].items()}
        self.active = int(state["active"])
        real_sum = state.get("real_sum")          # absent in checkpoints written before it: the flush runs them all
        self.real_sum = list(real_sum) if isinstance(real_sum, (list, tuple)) else real_sum
        self.summed = state.get("summed", 0)
        self.stats = {}
        for y, (mean, cov, weight) in state["stats"].items():
            s = self.stats[int(y)] = LabelStatistics(self.full)
            s.mean, s.cov, s.weight = mean, cov, float(weight)
