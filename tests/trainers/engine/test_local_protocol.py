"""The local evaluation protocol (CycleSL §4.1; docs/formats.md "local_accuracy"): each device's model on the samples
it holds out, correct predictions pooled over all held-out samples — recomputed here in plain torch from each
device's own model and rows, with devices holding unequal numbers of samples and one holding none."""

from __future__ import annotations

import numpy as np
import torch

from tests.engine_builders import make_engine


def _by_hand(eng, held: dict[int, np.ndarray]) -> tuple[int, int, list[float]]:
    """(correct, total, per-device accuracies) of each device's own model [w_c,i; w_s] on its held-out rows."""
    correct = total = 0
    each = []
    x, y = eng.data.x_train, eng.data.y_train
    for d, rows in held.items():
        model = eng.device_model(d).eval()
        with torch.no_grad():
            right = int((model(x[torch.from_numpy(rows)]).argmax(1) == y[torch.from_numpy(rows)]).sum())
        correct, total = correct + right, total + len(rows)
        each.append(right / len(rows))
    return correct, total, each


def test_the_local_accuracy_pools_each_devices_own_model_on_its_own_rows() -> None:
    eng = make_engine("psl", [3, 3, 3], 3, lr=0.2)         # PSL: each device keeps its own client model
    for t in range(1, 4):
        eng.run_round(t)
    rng = np.random.default_rng(5)
    held = {0: rng.choice(len(eng.data.y_train), 7, replace=False),
            2: rng.choice(len(eng.data.y_train), 40, replace=False)}
    eng.data.local_test = [held[0], np.zeros(0, dtype=np.int64), held[2]]     # device 1 holds nothing out
    correct, total, each = _by_hand(eng, held)
    assert total == 47 and eng.evaluate_local() == correct / total
    assert correct / total != sum(each) / len(each)       # unequal sizes: pooling is not the mean over devices


def test_no_held_out_sample_anywhere_gives_no_local_accuracy() -> None:
    eng = make_engine("sfl-v2", [3, 3], 2)
    eng.data.local_test = [np.zeros(0, dtype=np.int64)] * 2
    assert eng.evaluate_local() is None
    eng.data.local_test = []
    assert eng.evaluate_local() is None
