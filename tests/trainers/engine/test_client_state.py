"""--client-state (issue 69 item 4): a device that loads the global client model keeps its optimizer state or
restarts it, one convention for every algorithm of a comparison; "algorithm" leaves each algorithm's own
(docs/algorithms.md "Optimizer state": SplitFed keeps, SCALA restarts)."""

from __future__ import annotations

import pytest
import torch

from tests.engine_builders import flat, make_data, small_model
from trainers.config.train_config import TrainConfig
from trainers.engine.split_engine import SplitEngine
from trainers.roles.optim import OptimizerSpec
from trainers.strategies import make_strategy


def _engine(algorithm: str, restart: bool | None, options: dict | None = None) -> SplitEngine:
    spec = OptimizerSpec("sgd", 0.05, 0.9, restart_on_download=restart)
    return SplitEngine(small_model(), [3, 3, 3], make_strategy(algorithm, options or {}), make_data(3), spec,
                       batch_size=16, seed=0, interval=1)


def _states(engine: SplitEngine) -> list[int]:
    """How many parameters hold optimizer state, per device."""
    return [len(d.optimizer.torch.state) for d in engine.devices]


@pytest.mark.parametrize("algorithm, options, restart, fresh", [
    ("sfl-v1", None, None, False), ("sfl-v1", None, True, True), ("sfl-v1", None, False, False),
    ("scala", {"participation": 1.0}, None, True), ("scala", {"participation": 1.0}, False, False),
])
def test_the_convention_overrides_the_algorithms_own(algorithm, options, restart, fresh) -> None:
    engine = _engine(algorithm, restart, options)
    assert engine.fresh_client_state is fresh
    if algorithm == "sfl-v1":
        engine.run_round(1)               # every device trains, then downloads the average at the round's end
        assert all(n == 0 for n in _states(engine)) if fresh else all(n > 0 for n in _states(engine))


def test_restarting_is_clearing_the_state_after_the_download() -> None:
    """SplitFed V1 with restart equals SplitFed V1 keeping its state with every device's optimizer state cleared
    by hand after each round's download, parameter for parameter."""
    restarted, kept = _engine("sfl-v1", True), _engine("sfl-v1", False)
    for t in (1, 2, 3):
        restarted.run_round(t)
        kept.run_round(t)
        for d in kept.devices:
            d.optimizer.torch.state.clear()
    for d in range(3):
        assert torch.equal(flat(restarted.device_model(d)), flat(kept.device_model(d)))
    moving = _engine("sfl-v1", False)
    for t in (1, 2, 3):
        moving.run_round(t)
    assert not torch.equal(flat(moving.device_model(0)), flat(kept.device_model(0)))   # momentum kept: another run


def test_the_run_option_reaches_the_client_spec_only() -> None:
    for value, restart in (("algorithm", None), ("keep", False), ("restart", True)):
        config = TrainConfig.flat(algorithm="sfl-v1", client_state=value)
        assert config.optimizer_spec("client").restart_on_download is restart
        assert config.optimizer_spec("server").restart_on_download is None
