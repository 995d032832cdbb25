"""The largest frame of a run (trainers/distributed/frame_bound.py) and the broker limits derived from it
(trainers/distributed/broker.py BrokerLimits; issue 67 M4): the formula written out, and every large message
of a real run, encoded as the wire sends it, within the bound and not far below it."""

from __future__ import annotations

import time

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


@pytest.mark.parametrize("model", ["cnn", "mlp"])
def test_every_large_message_of_a_run_fits_the_bound_the_broker_is_given(model: str) -> None:
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
    setup = Setup({"dataset": "synthetic", "model": model}, [dict(b.state_dict()) for b in blocks],
                  {i: DeviceSpec(1, torch.arange(data.x_train.shape[0]), 16, [0, i], OptimizerSpec("adam"))
                   for i in range(3)})
    activations = []
    with torch.no_grad():
        h = x
        for j, block in enumerate(blocks[:-1]):
            h = block(h)
            activations.append(Activation(0, 1, 0, h.clone(), y))
    sizes = {name: max(len(wire.encode(Envelope(m, time.time()), 0, 1, 0, b"k" * 32, "a" * 16, "b" * 16)) for m in msgs)
             for name, msgs in [("model", [upload]), ("setup", [setup]), ("activation", activations)]}
    largest = max(sizes.values())
    assert largest <= bound.largest, (sizes, bound)
    assert largest >= (bound.largest - HEADER_BYTES) / SAFETY / 1.5, (sizes, bound)   # and the estimate is not loose
