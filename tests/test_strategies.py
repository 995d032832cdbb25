"""Strategy equivalences and aggregation schedules (docs/model.md §2.1 eqs. 4–7)."""

from __future__ import annotations

import pytest
import torch

from adaptplan.errors import InputError
from trainers.strategies import make_strategy
from test_engine import make_engine, params


def test_sfl_v1_equals_adaptsfl_at_interval_one() -> None:
    v1 = make_engine("sfl-v1", [4, 4, 4], devices=3, interval=1)
    ad = make_engine("adaptsfl", [4, 4, 4], devices=3, interval=1)
    for t in range(1, 5):
        assert v1.run_round(t).aggregated and ad.run_round(t).aggregated
    for d in range(3):
        for a, b in zip(params(v1.device_model(d)), params(ad.device_model(d)), strict=True):
            assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_adaptsfl_averages_exactly_every_interval() -> None:
    interval = 3
    engine = make_engine("adaptsfl", [2, 4, 4], devices=3, interval=interval)
    for t in range(1, 8):
        stats = engine.run_round(t)
        assert stats.aggregated == (t % interval == 0)
        forged = [[p for j in range(engine.deepest_cut) for p in engine.block(d, j).parameters()] for d in range(3)]
        equal = all(torch.equal(a, b) for a, b in zip(forged[0], forged[1]))
        assert equal == (t % interval == 0), t
        assert stats.bytes_server > 0 if t % interval == 0 else stats.bytes_server == 0


def test_psl_never_averages_client_models() -> None:
    engine = make_engine("psl", [3, 3, 3], devices=3)
    for t in range(1, 5):
        assert not engine.run_round(t).aggregated
        first = [p for j in range(3) for p in engine.block(0, j).parameters()]
        second = [p for j in range(3) for p in engine.block(1, j).parameters()]
        assert not any(torch.equal(a, b) for a, b in zip(first, second))
    assert len(engine.strategy.eval_models(engine)) == 3      # mean accuracy over devices


def test_sfl_v2_server_is_sequential_and_clients_averaged() -> None:
    engine = make_engine("sfl-v2", [3, 3], devices=2, interval=1)
    parallel = make_engine("psl", [3, 3], devices=2)
    server_before = params(engine.block(0, 6))
    stats = engine.run_round(1)
    parallel.run_round(1)
    assert stats.aggregated
    assert all(torch.equal(a, b) for a, b in zip(params(engine.block(0, 0)), params(engine.block(1, 0))))
    assert not any(torch.equal(a, b) for a, b in zip(server_before, params(engine.block(0, 6))))
    # two sequential steps (device 1 sees the server already updated by device 0) ≠ one averaged step
    assert not any(torch.equal(a, b) for a, b in zip(params(parallel.block(0, 6)), params(engine.block(0, 6))))


def test_unknown_algorithm_lists_valid_names() -> None:
    with pytest.raises(InputError, match="sfl-v1"):
        make_strategy("splitfed")


def test_sl_rejects_heterogeneous_cuts() -> None:
    with pytest.raises(InputError, match="cuts"):
        make_engine("sl", [2, 3], devices=2)
