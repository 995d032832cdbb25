"""FedAvg (trainers/strategies/fedavg.py) against federated averaging with client sampling written out
(tests/federated_reference.py: the whole model on each device, one SGD step a round, |𝒟_k|-weighted averages
every I rounds), its cut (L on every device, the registry's ``whole_model``) and what a round costs on the clock."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from adaptplan.cli import main
from adaptplan.errors import InputError
from tests.engine_builders import flat, make_data, small_model
from tests.federated_reference import check_round, federated_reference
from trainers.engine.split_engine import SplitEngine
from trainers.strategies import make_strategy

B, LR, N, L = 16, 0.1, 4, 11            # small_model: 11 blocks, 10 classes


def plain_ce(device: int, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits, labels)


@pytest.mark.parametrize("rho,interval", [(0.5, 2), (1.0, 1)])
def test_fedavg_is_federated_averaging_with_sampling(rho: float, interval: int) -> None:
    data = make_data(N, "dirichlet")
    engine = SplitEngine(small_model(), [L] * N, make_strategy("fedavg", {"participation": rho}), data, {"lr": LR},
                         batch_size=B, seed=0, interval=interval)
    for ref in federated_reference(small_model(), data, plain_ce, 5, rho, interval, LR, B):
        check_round(engine, ref)
        (evaluated,) = engine.strategy.eval_models(engine)
        expected = ref.global_model if ref.t >= interval else small_model()
        assert torch.allclose(flat(evaluated), flat(expected), atol=1e-6, rtol=0), ref.t


def test_a_round_sends_logits_and_labels_and_an_average_the_whole_model() -> None:
    """Bytes recomputed from the model: b logits of 10 float32 and b int64 labels up per participant and step, the
    cut gradient (b × 10 float32) down; at an average every participant uploads and downloads all L blocks."""
    data = make_data(N)
    engine = SplitEngine(small_model(), [L] * N, make_strategy("fedavg", {"participation": 1.0}), data, {"lr": LR},
                         batch_size=B, seed=0, interval=2)
    model_bytes = sum(p.numel() * 4 for p in small_model().parameters()) + \
        sum(b.numel() * b.element_size() for b in small_model().buffers())
    step_up, step_down = B * 10 * 4 + B * 8, B * 10 * 4
    first, second = engine.run_round(1), engine.run_round(2)
    assert (first.bytes_up, first.bytes_down, first.aggregated) == (N * step_up, N * step_down, False)
    assert (second.bytes_up, second.bytes_down) == (N * (step_up + model_bytes), N * (step_down + model_bytes))
    assert second.bytes_server == 0                              # the edge server holds no block of anyone's


def test_a_cut_below_the_whole_model_is_refused() -> None:
    with pytest.raises(InputError) as err:
        SplitEngine(small_model(), [L] * (N - 1) + [4], make_strategy("fedavg"), make_data(N), {"lr": LR},
                    batch_size=B, seed=0)
    assert err.value.field == "cuts" and "every cut must be 11, got [4, 11]" in err.value.message


@pytest.mark.parametrize("flags,field", [(["--cuts", "2"], "--cuts"), (["--policy", "rma+rms"], "--policy"),
                                         (["--reestimate", "--replan-every", "2"], "--replan-every")])
def test_train_refuses_a_plan_for_the_whole_model_naming_the_flag(tmp_path, capsys, flags, field) -> None:
    argv = ["train", "--algorithm", "fedavg", "--devices", "2", "--rounds", "1", "--dataset", "synthetic", "--model",
            "mlp", "--no-progress", "--out", str(tmp_path / "run"), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{field}: fedavg trains the whole model on every device (no split)" in err, err


def test_train_says_where_its_cut_comes_from(tmp_path, capsys) -> None:
    argv = ["train", "--algorithm", "fedavg", "--devices", "2", "--rounds", "2", "--dataset", "synthetic", "--model",
            "mlp", "--no-progress", "--interval", "2", "--out", str(tmp_path / "run")]
    assert main(argv) == 0
    assert ("plan from fedavg (no split: the whole model on every device): 2× cut 3 of 3 cut points, interval I = 2"
            in capsys.readouterr().err)
