"""The fed server's robust rules (issue 67 item 2; Yin et al., ICML 2018): coordinate-wise median and trimmed mean
against values worked out by hand, one outlier upload moving the global model by at most the honest uploads'
spread (FedAvg's mean: by outlier/n), their cost on the simulated clock, and a run whose lying device is outvoted."""

from __future__ import annotations

import math

import pytest
import torch

from trainers.roles.core import FedServer, RobustMean, robust_flops
from trainers.roles.messages import BlockState, ModelUpload


def states(*values: float) -> list[dict[str, torch.Tensor]]:
    return [{"w": torch.tensor([float(v), -float(v)]), "n": torch.tensor(7)} for v in values]


def combine(rule: str, trim: float, *values: float) -> torch.Tensor:
    robust = RobustMean(rule, trim)
    for state in states(*values):
        robust.add(state, weight=1e30)                      # weights are not used by the robust rules
    out = robust.result()
    assert out["n"].item() == 7 and out["n"].dtype == torch.int64       # integer entries: the first state's
    return out["w"]


@pytest.mark.parametrize(("rule", "trim", "values", "expected"), [
    ("median", 0.0, (3, 1, 2), 2.0),
    ("median", 0.0, (4, 1, 3, 2), 2.5),                    # even count: the mean of the two middle values
    ("median", 0.0, (5,), 5.0),
    ("trimmed-mean", 0.25, (1, 2, 3, 100), 2.5),          # ⌊0.25·4⌋ = 1 dropped at each end
    ("trimmed-mean", 0.2, (1, 2, 3, 4, 100), 3.0),        # ⌊0.2·5⌋ = 1
    ("trimmed-mean", 0.19, (1, 2, 3, 4, 100), 22.0),      # ⌊0.19·5⌋ = 0: the plain mean
    ("trimmed-mean", 0.4, (1, 2, 3, 4, 100), 3.0),        # ⌊0.4·5⌋ = 2: the median alone
])
def test_the_rules_per_coordinate_as_worked_out_by_hand(rule, trim, values, expected) -> None:
    assert combine(rule, trim, *values).tolist() == pytest.approx([expected, -expected])


def test_a_robust_rule_needs_a_known_name_and_a_trim_below_a_half() -> None:
    for rule, trim in (("mean", 0.0), ("krum", 0.0), ("trimmed-mean", 0.5), ("median", -0.1)):
        with pytest.raises(ValueError):
            RobustMean(rule, trim)


def upload(device: int, value: float) -> ModelUpload:
    return ModelUpload(device, 1, "device", {0: BlockState({"w": torch.full((3,), value)})}, weight=1.0)


@pytest.mark.parametrize(("rule", "trim"), [("median", 0.0), ("trimmed-mean", 0.2)])
def test_one_outlier_upload_moves_the_global_model_at_most_by_the_honest_spread(rule, trim) -> None:
    honest = [1.0, 1.5, 2.0, 2.5]
    for outlier in (1e6, -1e6, float(3e38)):
        fed = FedServer()
        fed.rule = (rule, trim)
        for d, v in enumerate([*honest, outlier]):
            fed.add(upload(d, v))
        got = fed.finish(1)[0, 0].state["w"]
        assert bool(((got >= min(honest)) & (got <= max(honest))).all()), (rule, outlier, got)
    mean = FedServer()                                       # FedAvg's mean: the outlier moves it by outlier / n
    for d, v in enumerate([*honest, 1e6]):
        mean.add(upload(d, v))
    assert mean.finish(1)[0, 0].state["w"][0].item() == pytest.approx((sum(honest) + 1e6) / 5)


def test_the_cost_on_the_clock_is_a_sort_and_a_mean_per_entry() -> None:
    assert robust_flops("mean", 20, 1000) == 0.0 and robust_flops("median", 1, 1000) == 0.0
    assert robust_flops("median", 20, 1000) == 1000 * 20 * (math.ceil(math.log2(20)) + 1)
    assert robust_flops("trimmed-mean", 8, 10) == 10 * 8 * 4


TINY = dict(dataset="synthetic", devices=4, batch_size=4, model_width=4, eval_every=2, threads=1, lr=0.05,
            max_test_samples=40, progress=False, algorithm="sfl-v1", cuts=(2,), rounds=2)


def test_a_run_outvotes_a_lying_device_and_pays_for_the_sorts(monkeypatch) -> None:
    """Device 0 uploads its blocks plus 10⁴ (well-formed, so the checks pass): under the mean the global client
    model moves by ~10⁴/4, under the median it stays with the honest devices'; the median's sorts add simulated
    seconds at f_s, and nothing else about the run changes."""
    from trainers.config.train_config import TrainConfig
    from trainers.roles.core import Device
    from trainers.run.driver import Trainer

    honest = Trainer(TrainConfig.flat(**TINY)).run()
    sorted_run = Trainer(TrainConfig.flat(**TINY, aggregation="median"))
    median_history = sorted_run.run()
    assert [r.train_loss for r in median_history.records][0] == honest.records[0].train_loss    # before any average
    engine = sorted_run.engine
    extra = sum(robust_flops("median", 4, engine.block_values[j]) for j in range(engine.num_blocks)
                ) / engine.clock.system(1).server_flops          # SplitFed V1 averages every block over the 4 devices
    assert median_history.records[0].sim_seconds == pytest.approx(honest.records[0].sim_seconds + extra, rel=1e-9)

    real_upload = Device.upload

    def lying(self, round_index, blocks, weight, with_optimizer=False):
        msg = real_upload(self, round_index, blocks, weight, with_optimizer)
        if self.index == 0:
            for block in msg.blocks.values():
                block.state = {k: v + 1e4 if v.is_floating_point() else v for k, v in block.state.items()}
        return msg

    monkeypatch.setattr(Device, "upload", lying)
    largest = {}
    for rule in ("mean", "median"):
        trainer = Trainer(TrainConfig.flat(**TINY, aggregation=rule))
        trainer.run()
        largest[rule] = max(float(p.detach().abs().max()) for p in trainer.engine.global_model()[0].parameters())
    assert largest["mean"] > 2000 and largest["median"] < 10, largest
