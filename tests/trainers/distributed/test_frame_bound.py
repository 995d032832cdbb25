"""The largest frame of a run (trainers/distributed/frame_bound.py) and the broker limits derived from it
(trainers/distributed/broker.py BrokerLimits; issue 67 M4): the formula written out, and every large message
of a real run, encoded as the wire sends it, within the bound and not far below it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from trainers.config.optimizer_spec import OptimizerSpec
from trainers.config.train_config import TrainConfig
from trainers.distributed import wire
from trainers.distributed.broker import MQTT_MAX_PACKET_BYTES, BrokerLimits, broker_settings
from trainers.distributed.control import DeviceSpec, Envelope, Setup
from trainers.distributed.frame_bound import HEADER_BYTES, SAFETY, frame_bound, largest_frame
from trainers.inputs.datasets import load_dataset
from trainers.inputs.models import build_model
from trainers.roles.messages import Activation, BlockState, ModelUpload
from profilers.chain import build_chain


def test_the_bound_is_the_largest_message_written_out() -> None:
    bound = frame_bound(model_bytes=1000, parameter_bytes=900, largest_output_bytes=50, batch_size=16, num_train=300)
    assert (bound.model_message, bound.setup, bound.activation) == (1000 + 2 * 900, 1000 + 8 * 300, 16 * (50 + 8))
    assert bound.largest == SAFETY * 3400 + HEADER_BYTES
    assert frame_bound(10, 10, 10_000, 64, 10).largest == SAFETY * 64 * 10_008 + HEADER_BYTES


def test_the_broker_limits_come_from_the_largest_frame_and_the_ranks() -> None:
    limits = BrokerLimits.for_run(world=4, largest_frame_bytes=10_000)
    assert limits == BrokerLimits(max_packet_bytes=11_024, queued_messages=64 * 3, queued_bytes=4 * 3 * 11_024)
    assert BrokerLimits.for_run(3, 10 ** 12).max_packet_bytes == MQTT_MAX_PACKET_BYTES == 268_435_460
    text = broker_settings(limits).splitlines()
    for line in ("retain_available false", "max_packet_size 11024", "max_queued_messages 192",
                 "max_queued_bytes 132288", "allow_anonymous false", "persistence false"):
        assert line in text, line


FRAME_OVERHEAD = 16 * 1024
"""Bytes a frame adds to its tensors' (JSON header with every entry's name, shape and dtype; tag)."""


@pytest.mark.parametrize("model", ["cnn", "mlp"])
def test_every_large_message_of_a_run_is_estimated_by_its_part_of_the_bound(model: str) -> None:
    """Each large message of a run (trainers/distributed/frame_bound.py's list), built from the run's chain and
    encoded as the wire sends it: a model upload with Adam's state, the Setup of a rank hosting all 3 devices, an
    activation at every cut. The model message and the Setup are their estimates plus the frame's own bytes; an
    activation is at most its estimate (the largest output of any layer, not only of a cut) and not far below."""
    import numpy as np

    config = TrainConfig.flat(devices=3, dataset="synthetic", model=model, model_width=4, batch_size=16)
    bound = largest_frame(config)
    data = load_dataset("synthetic")
    torch.manual_seed(0)
    chain = build_chain(build_model(model, tuple(data.x_train.shape[1:]), data.num_classes, 4), data.x_train[:2])
    blocks = chain.blocks
    x, y = data.x_train[:16], data.y_train[:16].long()
    adam = torch.optim.Adam(blocks.parameters())
    torch.nn.functional.cross_entropy(blocks(x), y).backward()
    adam.step()
    upload = ModelUpload(0, 1, "device", {j: BlockState(dict(b.state_dict()), [dict(adam.state[p]) for p in b.parameters()])
                                          for j, b in enumerate(blocks)})
    parts = np.array_split(np.arange(data.x_train.shape[0]), 3)
    setup = Setup({"dataset": "synthetic", "model": model}, [dict(b.state_dict()) for b in blocks],
                  {i: DeviceSpec(1, torch.as_tensor(parts[i]), 16, [0, i], OptimizerSpec("adam")) for i in range(3)})
    activations = []
    with torch.no_grad():
        h = x
        for block in blocks[:-1]:
            h = block(h)
            activations.append(Activation(0, 1, 0, h.clone(), y))

    def size(msg) -> int:
        return len(wire.encode(Envelope(msg, time.time()), 0, 1, 0, b"k" * 32, "a" * 16, "b" * 16))

    assert 0 <= size(upload) - bound.model_message <= FRAME_OVERHEAD, (size(upload), bound)
    assert 0 <= size(setup) - bound.setup <= FRAME_OVERHEAD, (size(setup), bound)
    largest_activation = max(a.num_bytes for a in activations)            # its tensors: the activation and labels
    assert largest_activation <= bound.activation <= 4 * largest_activation, (largest_activation, bound)
    assert max(size(upload), size(setup), *(size(a) for a in activations)) <= bound.largest


def test_the_model_is_measured_with_its_buffers_and_every_layers_output(monkeypatch) -> None:
    """A model written out by hand (synthetic data: 1×8×8 inputs, 10 classes): Flatten, Linear(64, 10),
    BatchNorm1d(10). Parameters 64·10 + 10 + 2·10 = 670 float32 (2,680 bytes); buffers: running mean and variance
    (20 float32) and the batch count (one int64): 88 bytes; the largest layer output is the flattened input, 64
    float32 per sample."""
    from torch import nn

    from trainers.inputs import models

    monkeypatch.setattr(models, "build_model", lambda name, shape, classes, width: nn.Sequential(
        nn.Flatten(), nn.Linear(64, 10), nn.BatchNorm1d(10)))
    num_train = int(load_dataset("synthetic").x_train.shape[0])
    bound = largest_frame(TrainConfig.flat(devices=3, dataset="synthetic", model="mlp", batch_size=16))
    assert bound.model_message == 2680 + 88 + 2 * 2680
    assert bound.setup == 2680 + 88 + 8 * num_train
    assert bound.activation == 16 * (64 * 4 + 8)


def test_a_layer_output_counts_one_samples_bytes_of_its_largest_tensor() -> None:
    from trainers.distributed.frame_bound import _bytes_per_sample

    assert _bytes_per_sample(torch.zeros(5, 3, 2)) == 6 * 4
    assert _bytes_per_sample((torch.zeros(5, 2, dtype=torch.float64), torch.zeros(5, 7, dtype=torch.int8))) == 16
    assert _bytes_per_sample(torch.tensor(1.0)) == 4 and _bytes_per_sample(None) == 0 and _bytes_per_sample(()) == 0


def test_the_documented_factors() -> None:
    """docs/mqtt.md "What the broker bounds" states them: ×2 plus 1 MiB, two optimizer tensors per parameter."""
    from trainers.distributed.frame_bound import OPTIMIZER_SLOTS

    assert (SAFETY, HEADER_BYTES, OPTIMIZER_SLOTS) == (2, 1 << 20, 2)
    text = " ".join((Path(__file__).resolve().parents[3] / "docs" / "mqtt.md").read_text().split())
    assert "two optimizer tensors per parameter" in text and "×2 plus 1 MiB for headers" in text


def test_fedconcats_bound_holds_its_second_stage_of_k_encoders_side_by_side(monkeypatch) -> None:
    """FedConcat moves to K = 3 encoders under Linear(3·16, 10) after its first stage; written out from a model by
    hand (1×8×8 inputs, 10 classes): the run's model Flatten, Linear(64, 16), ReLU, Linear(16, 10) has 1,210
    parameters, the second stage's 3·(64·16 + 16) + 48·10 + 10 = 3,610 (14,440 bytes), no buffers; the largest layer
    output stays the flattened input (64 float32 a sample, over the 48 features concatenated). The bound is the
    second stage's; another algorithm's is the run's model's."""
    from torch import nn

    from trainers.inputs import models

    monkeypatch.setattr(models, "build_model", lambda name, shape, classes, width: nn.Sequential(
        nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10)))
    num_train = int(load_dataset("synthetic").x_train.shape[0])
    values = dict(devices=3, dataset="synthetic", model="mlp", batch_size=16)
    bound = largest_frame(TrainConfig.flat(algorithm="fedconcat", extra={"clusters": 3}, **values))
    assert (bound.model_message, bound.setup, bound.activation) == (3 * 14_440, 14_440 + 8 * num_train, 16 * (64 * 4 + 8))
    base = largest_frame(TrainConfig.flat(algorithm="sfl-v1", **values))
    assert (base.model_message, base.setup) == (3 * 4_840, 4_840 + 8 * num_train)
