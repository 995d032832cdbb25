"""The defences of a device's activations (trainers/roles/defences.py, docs/privacy.md "Defences"): each against its
definition written out here — the clip, the Gaussian noise's scale and stream, the device's step through the clip and
through NoPeek's penalty (against finite differences of the distance correlation), the recomputing path against the
plain one, and the accountant against the Gaussian mechanism's Rényi DP in closed form (q = 1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from profilers.leakage import distance_correlation, distance_correlation_tensor
from trainers.inputs.partition import DeviceSampler
from trainers.roles.core import Device
from trainers.roles.defences import ActivationDefence, activation_epsilon
from trainers.roles.messages import CutGradient
from trainers.roles.optim import OptimizerSpec

torch.set_num_threads(1)


def _device(defence: ActivationDefence, n: int = 40, batch: int = 8, seed: int = 3) -> Device:
    torch.manual_seed(seed)
    template = nn.Sequential(nn.Sequential(nn.Linear(6, 5), nn.Tanh()), nn.Linear(5, 3))
    x, y = torch.randn(n, 6), torch.randint(0, 3, (n,))
    return Device(0, template, 1, x, y, np.arange(n), batch, [seed, 0], OptimizerSpec(lr=0.5), defence)


def test_the_clip_scales_each_row_to_at_most_c_and_keeps_the_short_ones() -> None:
    h = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])          # norms 5, 0.5, 0
    clipped = ActivationDefence(clip=1.0).clipped(h)
    assert torch.allclose(clipped, torch.tensor([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]]))
    assert torch.equal(ActivationDefence().clipped(h), h)
    images = torch.randn(16, 2, 3, 3) * 5
    norms = ActivationDefence(clip=2.0).clipped(images).reshape(16, -1).norm(dim=1)
    assert torch.allclose(norms, torch.minimum(images.reshape(16, -1).norm(dim=1), torch.tensor(2.0)))


def test_a_bound_per_value_is_c_sqrt_d_at_every_cut_and_its_noise_sigma_c_sqrt_d() -> None:
    """clip_per_value: C = c·√d for the d values a sample sends, so a wide and a narrow activation are clipped to the
    same RMS c and noised with s.d. σ·C = σ·c·√d per value (the Gaussian mechanism at sensitivity C)."""
    defence = ActivationDefence(clip=0.5, noise_multiplier=2.0, clip_per_value=True)
    for shape in ((64, 3, 4, 4), (64, 7)):
        h = torch.randn(*shape) * 10
        d = h[0].numel()
        assert defence.bound(h) == pytest.approx(0.5 * d ** 0.5)
        rms = defence.clipped(h).reshape(64, -1).pow(2).mean(dim=1).sqrt()
        assert torch.allclose(rms, torch.full((64,), 0.5), rtol=1e-5)
        z = defence.noise(h, torch.Generator().manual_seed(1))
        assert float(z.std()) == pytest.approx(d ** 0.5, rel=0.06)       # σ·c·√d, σ·c = 1
    assert ActivationDefence(clip=0.5).bound(torch.zeros(2, 9)) == 0.5


def _drawn(dev: Device, steps: int = 1) -> torch.Tensor:
    """The sample indices the device's sampler drew at its ``steps``-th draw (a twin sampler from the same seed)."""
    twin = DeviceSampler(dev.sampler.indices, dev.sampler.batch_size, [3, 0])
    for _ in range(steps - 1):
        twin.next()
    return torch.from_numpy(twin.next())


def test_the_noise_has_standard_deviation_sigma_c_and_leaves_the_runs_random_stream_alone() -> None:
    defence = ActivationDefence(clip=0.5, noise_multiplier=2.0)
    dev = _device(defence, n=4000, batch=4000)
    before = torch.get_rng_state()
    msg = dev.forward(1)
    assert torch.equal(torch.get_rng_state(), before)                # Dropout masks and samplers see no difference
    with torch.no_grad():
        residual = msg.tensor - defence.clipped(dev.blocks[0](dev.x[_drawn(dev)]))
    assert abs(float(residual.std()) - 1.0) < 0.03 and abs(float(residual.mean())) < 0.02   # σ·C = 1
    again = _device(defence, n=4000, batch=4000).forward(1).tensor
    assert torch.equal(again, msg.tensor)                              # the device's stream, from its seed


def test_the_device_steps_through_the_clip_as_written_out() -> None:
    clip = 0.4
    dev, ref = _device(ActivationDefence(clip=clip)), _device(ActivationDefence())
    msg = dev.forward(1)
    g = torch.randn_like(msg.tensor)
    idx = _drawn(dev)
    # reference: w ← w − γ ∂/∂w Σ_k ⟨g_k, a_k · min(1, C/‖a_k‖)⟩ at the same weights, on the same samples
    block = ref.blocks[0]
    a = block(ref.x[idx])
    sent = a * torch.clamp(clip / a.norm(dim=1, keepdim=True), max=1.0)
    assert torch.allclose(sent.detach(), msg.tensor, atol=1e-6)
    (sent * g).sum().backward()
    expected = [p.detach() - 0.5 * p.grad for p in block.parameters()]
    dev.backward(CutGradient(0, 1, msg.step, g))
    assert all(torch.allclose(p.detach(), e, atol=1e-6) for p, e in zip(dev.blocks[0].parameters(), expected))


def test_nopeeks_step_follows_the_distance_correlations_finite_differences() -> None:
    alpha = 0.7
    dev = _device(ActivationDefence(nopeek=alpha), batch=10)
    weight = dev.blocks[0][0].weight
    start, bias = weight.detach().clone(), dev.blocks[0][0].bias.detach().double().clone()
    msg = dev.forward(1)
    g = torch.zeros_like(msg.tensor)                                     # the server's gradient: none, the penalty alone
    idx = _drawn(dev)
    x = dev.x[idx].double()
    dev.backward(CutGradient(0, 1, msg.step, g))
    step = (start - weight.detach()) / 0.5                               # lr 0.5: the gradient the device followed

    def dcor_at(w: torch.Tensor) -> float:
        h = torch.tanh(x @ w.T + bias)
        return distance_correlation(x, h)

    eps = 1e-6
    for (r, c) in [(0, 0), (2, 3), (4, 5)]:
        plus, minus = start.double().clone(), start.double().clone()
        plus[r, c] += eps
        minus[r, c] -= eps
        numeric = alpha * (dcor_at(plus) - dcor_at(minus)) / (2 * eps)
        assert float(step[r, c]) == pytest.approx(numeric, rel=2e-3, abs=1e-6)


def test_a_device_whose_activations_nopeek_made_constant_steps_on_the_servers_gradient_alone() -> None:
    """Dead units (every sample's activation the same, as NoPeek pushes them): dCor is 0 with a zero gradient, on the
    graph, so the device steps on the server's gradient alone as an undefended one does (found by `bench plans
    --defence nopeek=0.5`, which crashed there)."""
    torch.manual_seed(0)
    template = nn.Sequential(nn.Sequential(nn.Linear(6, 5), nn.ReLU()), nn.Linear(5, 3))
    with torch.no_grad():
        template[0][0].weight.zero_()
        template[0][0].bias.fill_(-1.0)                                 # ReLU(−1) = 0 for every sample
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    devices = [Device(0, template, 1, x, y, np.arange(40), 8, [3, 0], OptimizerSpec(lr=0.5), defence)
               for defence in (ActivationDefence(nopeek=0.5), ActivationDefence())]
    for dev in devices:
        msg = dev.forward(1)
        dev.backward(CutGradient(0, 1, msg.step, torch.ones_like(msg.tensor)))
    assert torch.equal(devices[0].blocks[0][0].bias, devices[1].blocks[0][0].bias)
    value = distance_correlation_tensor(x, torch.zeros(40, 5, requires_grad=True) * 1.0)
    assert float(value) == 0.0 and value.requires_grad


def test_a_recomputing_device_sends_and_steps_as_the_plain_one() -> None:
    defence = ActivationDefence(clip=0.3, noise_multiplier=1.5, nopeek=0.2)
    plain, again = _device(defence), _device(defence)
    for t in range(1, 4):
        a, b = plain.forward(t), again.forward(t, recompute=True)
        assert torch.equal(a.tensor, b.tensor)                          # the same noise: one stream per device
        g = torch.randn_like(a.tensor)
        plain.backward(CutGradient(0, t, a.step, g))
        again.backward(CutGradient(0, t, b.step, g))
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(plain.blocks.parameters(), again.blocks.parameters()))


def test_the_noise_stream_is_checkpointed_with_the_device() -> None:
    defence = ActivationDefence(clip=1.0, noise_multiplier=1.0)
    dev = _device(defence)
    dev.backward(CutGradient(0, 1, dev.forward(1).step, None))
    state = dev.state_dict()
    first = dev.forward(2).tensor
    other = _device(defence)
    other.load_state_dict(state)
    assert torch.equal(other.forward(2).tensor, first)
    del state["noise_rng"]
    with pytest.raises(ValueError, match="noise_rng"):
        _device(defence).load_state_dict(state)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="clip"):
        ActivationDefence(noise_multiplier=1.0)
    with pytest.raises(ValueError, match="nopeek"):
        ActivationDefence(nopeek=-1.0)
    with pytest.raises(ValueError, match="delta"):
        ActivationDefence(delta=1.0)


def _gaussian_epsilon(sigma: float, steps: int, delta: float, orders: list[float]) -> float:
    """q = 1: the Gaussian mechanism's RDP α/(2σ²) per step (Mironov 2017, Prop. 7) composed over the steps, turned
    into ε by Balle et al. 2020's conversion (Opacus' get_privacy_spent): min over α of
    T·α/(2σ²) + log((α − 1)/α) − (log δ + log α)/(α − 1)."""
    return min(steps * a / (2 * sigma ** 2) + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1)
               for a in orders)


@pytest.mark.parametrize("sigma, steps", [(1.0, 1), (2.0, 10), (4.0, 500)])
def test_the_accountant_equals_the_gaussian_mechanism_written_out_without_subsampling(sigma: float, steps: int) -> None:
    from opacus.accountants import RDPAccountant

    expected = _gaussian_epsilon(sigma, steps, 1e-5, [float(a) for a in RDPAccountant.DEFAULT_ALPHAS])
    assert activation_epsilon(sigma, 1.0, steps, 1e-5) == pytest.approx(expected, rel=1e-9)


def test_the_accountant_grows_with_steps_and_shrinks_with_noise_and_sampling() -> None:
    assert activation_epsilon(1.0, 0.1, 0, 1e-5) == 0.0
    assert activation_epsilon(0.0, 0.1, 5, 1e-5) == math.inf
    eps = [activation_epsilon(1.0, 0.1, t, 1e-5) for t in (1, 10, 100)]
    assert eps[0] < eps[1] < eps[2]
    assert activation_epsilon(2.0, 0.1, 100, 1e-5) < eps[2] < activation_epsilon(1.0, 1.0, 100, 1e-5)


def test_randomised_response_keeps_a_label_with_the_probability_written_out_and_spreads_the_rest_evenly() -> None:
    eps, m, n = 1.2, 5, 200_000
    defence = ActivationDefence(label_epsilon=eps, classes=m)
    p = math.exp(eps) / (math.exp(eps) + m - 1)
    assert defence.keep_probability() == pytest.approx(p, rel=1e-12)
    true = np.random.default_rng(0).integers(0, m, n)
    sent = defence.randomised(true, [7, 1])
    assert abs(float(np.mean(sent == true)) - p) < 0.005
    changed = sent[sent != true]
    shift = (changed - true[sent != true]) % m                          # which other class, relative to the true one
    assert np.allclose(np.bincount(shift, minlength=m)[1:] / changed.size, 1 / (m - 1), atol=0.01)
    assert np.array_equal(defence.randomised(true, [7, 1]), sent)       # drawn from the device's seed
    assert not np.array_equal(defence.randomised(true, [7, 2]), sent)
    assert np.array_equal(ActivationDefence().randomised(true, [7, 1]), true)
    assert ActivationDefence(label_epsilon=0.0, classes=4).keep_probability() == pytest.approx(0.25)


def test_a_device_sends_one_randomised_label_per_sample_however_often_it_is_drawn() -> None:
    defence = ActivationDefence(label_epsilon=0.5, classes=3)
    dev = _device(defence, n=40, batch=8)
    seen: dict[int, int] = {}
    for t in range(1, 16):                                              # three epochs of the device's 40 samples
        msg = dev.forward(t)
        for i, label in zip(_drawn(dev, t).tolist(), msg.labels.tolist()):
            assert seen.setdefault(i, label) == label
        dev.backward(CutGradient(0, t, msg.step, None))
    assert len(seen) == 40
    true = dev.y[torch.tensor(sorted(seen))].tolist()
    assert 0 < sum(a != b for a, b in zip(true, [seen[i] for i in sorted(seen)])) < 40
