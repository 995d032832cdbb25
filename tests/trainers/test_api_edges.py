"""The strategy API's counts at the edges their definitions put them (trainers/api.py): ⌈ρN⌉ devices where ρN is
not whole, SGLR's ⌊φ·n_t⌋ averaged rows at an odd n_t, SCALA's B_k = ⌊|D_k|·b·|C| / Σ|D_j|⌋ where it is not whole —
each written out from its definition."""

from __future__ import annotations

import math

import numpy as np
import torch

from trainers.api import RoundContext, common_gradient_rows, proportional_batch, sample_devices
from trainers.roles.messages import Activation


def _ctx(num_devices: int, sizes: list[int] | None = None, batch: int = 4, seed: int = 7,
         participants: list[int] | None = None) -> RoundContext:
    sizes = sizes or [10] * num_devices
    return RoundContext(1, num_devices, 3, [1] * num_devices, sizes, batch, 1, 1, None, np.random.default_rng(seed),
                        2, [np.ones(2)] * num_devices, participants=participants or [])


def test_sample_devices_takes_the_ceiling_of_rho_n_where_it_is_not_whole() -> None:
    for n, rho in ((10, 0.24), (10, 0.25), (7, 0.5), (3, 0.34), (20, 0.05), (9, 1 / 9)):
        assert len(sample_devices(_ctx(n), rho)) == math.ceil(rho * n), (n, rho)     # 3, 3, 4, 2, 1, 1
    assert len(sample_devices(_ctx(10), 0.24, minimum=4)) == 4
    assert sample_devices(_ctx(4), 1.0) == [0, 1, 2, 3]


def test_sglr_averages_the_floor_of_phi_n_rows_at_an_odd_count() -> None:
    """φ = 0.5 of 3 arrivals: ⌊1.5⌋ = 1 device receives the averaged row, the other two keep their own."""
    arrivals = [Activation(d, 1, 1, torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64)) for d in range(3)]
    grads = {d: torch.tensor([[1.0] * 3, [3.0] * 3]) * (d + 1) for d in range(3)}     # rows differ: a mean moves them
    out = common_gradient_rows(_ctx(3, sizes=[10, 20, 30]), arrivals, grads, 0.5)
    changed = [d for d in range(3) if not torch.equal(out[d], grads[d])]
    assert len(changed) == 1
    # the one averaged row: Σ|D_i| Σ_j G_i[j] / Σ|D_i|·b_i over the one device: its own row, G_i[j] summed over b_i
    (d,) = changed
    assert torch.allclose(out[d], grads[d].sum(0).expand(2, 3) / 2)


def test_scala_batch_is_the_floor_of_the_proportional_share() -> None:
    """|D| = (10, 20, 35), b = 4, |C| = 3: 10·12/65 = 1.85 → 1, 20·12/65 = 3.69 → 3, 35·12/65 = 6.46 → 6."""
    ctx = _ctx(3, sizes=[10, 20, 35], participants=[0, 1, 2])
    assert [proportional_batch(ctx, d) for d in range(3)] == [1, 3, 6]
    tiny = _ctx(3, sizes=[1, 100, 100], participants=[0, 1, 2])
    assert proportional_batch(tiny, 0) == 1                   # ⌊0.06⌋ = 0 → the floor of one sample


def test_the_active_count_is_capped_at_the_devices_and_half_of_them_by_default() -> None:
    """C = min(active, N); active 0: ⌈N/2⌉ (GAS's 10 of 20; 3 of 5)."""
    from trainers.strategies.fedbuff import FedBuff
    from trainers.strategies.gas import GAS

    for cls in (GAS, FedBuff):
        assert cls(active=10).active_count(_ctx(4)) == 4
        assert cls(active=4).active_count(_ctx(4)) == 4
        assert cls(active=3).active_count(_ctx(4)) == 3
        assert cls(active=0).active_count(_ctx(5)) == 3
        assert cls(active=0).active_count(_ctx(20)) == 10
