"""trainers.roles.checks: every rule of what a device may send, each at its edge (the first value refused and the
last one taken), the fed server's Take that checks an upload and replaces its stated weight, and the runtime's rules
per cut read from the model (tests/trainers/distributed/test_lying_device.py runs the same lies over real ranks)."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from trainers.roles.checks import (MAX_MAGNITUDE, ActivationRule, BadMessageError, check_activation, check_step,
                                   check_upload, schema_of)
from trainers.roles.hosts import FedHost, take
from trainers.roles.messages import Activation, BlockState, ModelUpload
from trainers.roles.protocol import Average, Take

RULE = ActivationRule((4, 2), torch.float32, 10)


def activation(rows: int = 3, **change) -> Activation:
    fields = dict(device=1, round=2, step=0, tensor=torch.ones(rows, 4, 2), labels=torch.arange(rows) % 10)
    fields.update(change)
    return Activation(**fields)


def refused(msg: Activation, rows: int = 3) -> BadMessageError:
    with pytest.raises(BadMessageError) as caught:
        check_activation(msg, 1, rows, RULE)
    return caught.value


def test_a_step_is_the_one_after_the_devices_last() -> None:
    """A device counts its steps by one from 1 (rank 0 knows its last; None: its first since it started)."""
    assert check_step(activation(step=1), 1, None) == 1 and check_step(activation(step=7), 1, None) == 7
    assert check_step(activation(step=5), 1, 4) == 5
    for step, last, why in [(6, 4, "step: is 6, but its last was 4: a device counts its steps by one"),
                            (4, 4, "step: is 4, but its last was 4"), (3, 4, "step: is 3, but its last was 4"),
                            (0, None, "step: is 0, not a step number"), (True, None, "step: is True, not a step number"),
                            (1.5, 0, "step: is 1.5, but its last was 0")]:
        with pytest.raises(BadMessageError) as caught:
            check_step(activation(step=step), 1, last)
        assert str(caught.value).startswith(f"device 1's activation: {why}"), str(caught.value)


def test_an_honest_activation_passes_at_every_edge_of_the_rules() -> None:
    check_activation(activation(), 1, 3, RULE)
    check_activation(activation(labels=torch.tensor([0, 9, 5])), 1, 3, RULE)                   # labels 0 and M − 1
    check_activation(activation(labels=torch.tensor([4, 4, 4])), 1, 3, RULE)                   # one class only
    check_activation(activation(tensor=torch.full((3, 4, 2), -MAX_MAGNITUDE)), 1, 3, RULE)     # |x| = the bound
    check_activation(activation(0, tensor=torch.ones(0, 4, 2), labels=torch.zeros(0, dtype=torch.int64)), 1, 0, RULE)


@pytest.mark.parametrize(("change", "field", "text"), [
    ({"device": 2}, "device", "is 2, but this is device 1's reply"),
    ({"tensor": torch.ones(3, 4, 2, dtype=torch.float64)}, "tensor.dtype", "is torch.float64, expected torch.float32"),
    ({"tensor": torch.ones(3, 4, 3)}, "tensor.shape", "is [3, 4, 3], expected [3, 4, 2] (3 samples asked for)"),
    ({"tensor": torch.ones(2, 4, 2)}, "tensor.shape", "is [2, 4, 2], expected [3, 4, 2]"),
    ({"labels": torch.tensor([0, 1])}, "labels", "are torch.int64[2], expected torch.int64[3] (one per row)"),
    ({"labels": torch.tensor([0, 1, 2], dtype=torch.int32)}, "labels", "are torch.int32[3]"),
    ({"labels": torch.tensor([0, 10, 2])}, "labels", "span 0..10, outside 0..9"),
    ({"labels": torch.tensor([-1, 1, 2])}, "labels", "span -1..2, outside 0..9"),
    ({"tensor": torch.full((3, 4, 2), MAX_MAGNITUDE * 1.01)}, "tensor", "holds 1.01e+10: NaN, infinite or above 1e+10"),
    ({"tensor": torch.full((3, 4, 2), float("nan"))}, "tensor", "holds nan"),
    ({"tensor": torch.full((3, 4, 2), float("-inf"))}, "tensor", "holds inf"),
    ({"labels": [0, 1, 2]}, "tensor", "the activation and its labels must be tensors"),
])
def test_a_lying_activation_is_refused_naming_the_device_and_the_field(change, field, text) -> None:
    error = refused(activation(**change))
    assert error.device == 1 and error.field == field
    assert str(error).startswith(f"device 1's activation: {field}: ") and text in str(error)


STATES = [nn.Linear(3, 2).state_dict(), nn.Linear(2, 2).state_dict()]
SCHEMA = schema_of(STATES)


def upload(blocks: dict[int, dict[str, torch.Tensor]], device: int = 0, weight: float = 5.0) -> ModelUpload:
    return ModelUpload(device, 1, "device", {j: BlockState(dict(s)) for j, s in blocks.items()}, weight)


def test_the_schema_is_each_blocks_entries_shapes_and_dtypes() -> None:
    assert SCHEMA == {0: {"weight": ((2, 3), "float32"), "bias": ((2,), "float32")},
                      1: {"weight": ((2, 2), "float32"), "bias": ((2,), "float32")}}


def test_an_upload_of_any_finite_magnitude_is_taken() -> None:
    """An honest diverging run's weights pass 10¹⁰ before they overflow (and stop it as a divergence)."""
    check_upload(upload({0: {**STATES[0], "bias": torch.tensor([3e38, -3e38])}}), 0, [0], SCHEMA)


@pytest.mark.parametrize(("blocks", "device", "field", "text"), [
    ({0: STATES[0]}, 1, "device", "is 0, but this is device 1's upload"),
    ({1: STATES[1]}, 0, "blocks", "holds block 1, which it was not asked for ([0])"),
    ({0: {"weight": STATES[0]["weight"]}}, 0, "blocks[0]", "differs at 'bias'"),
    ({0: {**STATES[0], "extra": torch.zeros(1)}}, 0, "blocks[0]", "differs at 'extra'"),
    ({0: {**STATES[0], "weight": torch.zeros(3, 2)}}, 0, "blocks[0].weight", "is torch.float32[3, 2], expected float32[2, 3]"),
    ({0: {**STATES[0], "bias": torch.zeros(2, dtype=torch.float64)}}, 0, "blocks[0].bias", "is torch.float64[2]"),
    ({0: {**STATES[0], "bias": torch.tensor([0.0, float("inf")])}}, 0, "blocks[0].bias", "holds NaN or infinite values"),
    ({0: {**STATES[0], "bias": [0.0, 1.0]}}, 0, "blocks[0].bias", "is list, expected float32[2]"),
    ({}, 0, "blocks", "holds blocks [], but it was asked for [0]"),                    # (hostile_frames: taken)
])
def test_a_lying_upload_is_refused_naming_the_device_and_the_field(blocks, device, field, text) -> None:
    with pytest.raises(BadMessageError) as caught:
        check_upload(upload(blocks), device, [0], SCHEMA)
    assert caught.value.field == field and text in str(caught.value)
    assert str(caught.value).startswith(f"device {device}'s model upload: {field}: ")


def test_the_fed_server_checks_what_it_takes_and_weighs_by_the_edge_servers_weight() -> None:
    """Issue 67 E8: a stated weight of 10³⁰ made the lying device's model the global one."""
    fed = FedHost()
    honest = {j: {k: torch.ones_like(v) for k, v in STATES[0].items()} for j in (0,)}
    liar = {j: {k: torch.full_like(v, 3.0) for k, v in STATES[0].items()} for j in (0,)}
    expect = {0: dict(SCHEMA[0])}
    take(fed, Take(0, weight=1.0, expect=expect), upload(honest, 0, weight=1.0), lambda *a: None)
    take(fed, Take(1, weight=1.0, expect=expect), upload(liar, 1, weight=1e30), lambda *a: None)
    fed.handle(Average(1), lambda *a: None)
    assert torch.equal(fed.latest[0, 0].state["bias"], torch.full((2,), 2.0))          # (1 + 3) / 2: equal weights
    with pytest.raises(BadMessageError, match="device 1's model upload: blocks\\[0\\].weight"):
        take(fed, Take(1, expect=expect), upload({0: {**STATES[0], "weight": torch.zeros(1)}}, 1), lambda *a: None)
    with pytest.raises(BadMessageError, match="device 1's model upload: type: is a Activation"):
        take(fed, Take(1, expect=expect), activation(), lambda *a: None)


def test_the_runtimes_rule_per_cut_is_the_models_activation_there() -> None:
    from trainers.distributed.network import activation_rules

    model = nn.Sequential(nn.Sequential(nn.Flatten(), nn.Linear(8, 5)), nn.ReLU(), nn.Linear(5, 3))
    rules = activation_rules(model, torch.zeros(1, 2, 4), 3)
    assert rules[1] == ActivationRule((5,), torch.float32, 3) and rules[2] == ActivationRule((5,), torch.float32, 3)
    assert rules[3].shape == (3,)


def test_blocks_hold_as_many_blocks_as_asked_each_like_the_template() -> None:
    """check_blocks: exactly ``count`` blocks (the device's cut, 1 up to the template's), each block like an upload's
    (entries, shape, dtype, finite)."""
    from trainers.roles.checks import check_blocks
    from trainers.roles.protocol import Blocks

    chain = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 2), nn.Linear(2, 2))
    states = [block.state_dict() for block in chain]
    schema = schema_of(states)
    check_blocks(Blocks(0, states[:2]), 0, range(2), schema)
    check_blocks(Blocks(0, states[:1]), 0, range(1), schema)               # a cut of 1 ...
    check_blocks(Blocks(0, states), 0, range(3), schema)                   # ... to the template's 3
    check_blocks(Blocks(0, [states[0], states[2]]), 0, [0, 2], schema)     # a cut of 1 and a head of 1 (U-shaped)
    with pytest.raises(BadMessageError, match=r"states\[2\].weight: is torch.float32\[2, 3\], expected float32\[2, 2\]"):
        check_blocks(Blocks(0, [states[0], states[1]]), 0, [0, 2], schema)  # the head's block checked as block 2
    for msg, count, text in [(Blocks(0, states[:1]), 2, "states: holds 1 blocks, expected 2"),
                             (Blocks(0, states), 2, "states: holds 3 blocks, expected 2"),
                             (Blocks(0, []), 1, "states: holds 0 blocks, expected 1"),
                             (Blocks(0, [{**states[0], "bias": torch.full((3,), float("nan"))}]), 1,
                              "states[0].bias: holds NaN or infinite values"),
                             (Blocks(0, [{"weight": states[0]["weight"]}]), 1,
                              "states[0]: holds entries ['weight'], expected ['bias', 'weight'] (differs at 'bias')"),
                             (Blocks(0, [states[1]]), 1, "states[0].weight: is torch.float32[2, 3], expected float32[3, 2]"),
                             (Blocks(1, states[:1]), 1, "device: is 1, but this is device 0's reply")]:
        with pytest.raises(BadMessageError) as caught:
            check_blocks(msg, 0, range(count), schema)
        assert str(caught.value) == f"device 0's blocks: {text}"


def test_one_value_just_above_the_magnitude_bound_is_refused_among_small_ones() -> None:
    """The bound is on the largest |value| (one outlier suffices), and just above 10¹⁰ is refused (a float64 model:
    a float32 cannot hold a value between 10¹⁰ and 10¹⁰ + 1024)."""
    x = torch.zeros(3, 4, 2, dtype=torch.float64)
    x[1, 2, 1] = -(MAX_MAGNITUDE + 0.5)
    with pytest.raises(BadMessageError, match=r"^device 1's activation: tensor: holds 1e\+10: NaN, infinite or above"):
        check_activation(activation(tensor=x), 1, 3, ActivationRule((4, 2), torch.float64, 10))
    x[1, 2, 1] = -MAX_MAGNITUDE
    check_activation(activation(tensor=x), 1, 3, ActivationRule((4, 2), torch.float64, 10))


def test_a_devices_upload_is_sent_as_a_device() -> None:
    """An upload sent as the edge server's ("edge") is booked to the edge server's links in the measured seconds that
    fit re-plans (trainers.distributed.timing.book_transfer): a device may only send as "device"."""
    honest = upload({0: STATES[0]})
    check_upload(honest, 0, [0], SCHEMA)
    with pytest.raises(BadMessageError, match=r"^device 0's model upload: sender: is 'edge', but a device sends as "):
        check_upload(ModelUpload(0, 1, "edge", honest.blocks, 5.0), 0, [0], SCHEMA)


def test_a_u_shaped_devices_activation_carries_no_label_and_one_that_does_is_refused() -> None:
    """Under a U-shaped split the rule is ``labels=False``: an int64[0] label tensor, whatever the rows; labels sent
    anyway (the device role would never) are a lie about the protocol, refused naming the field."""
    rule = ActivationRule((4, 2), torch.float32, 10, labels=False)
    check_activation(activation(labels=torch.zeros(0, dtype=torch.int64)), 1, 3, rule)
    for labels, why in [(torch.arange(3), "labels: are torch.int64[3], expected none (torch.int64[0])"),
                        (torch.zeros(0), "labels: are torch.float32[0], expected none")]:
        with pytest.raises(BadMessageError, match=re.escape(why)):
            check_activation(activation(labels=labels), 1, 3, rule)


def test_a_head_gradient_answers_its_features_tags_shape_dtype_and_magnitude() -> None:
    from trainers.roles.checks import check_head_gradient
    from trainers.roles.messages import HeadForward, HeadGradient

    asked = HeadForward(1, 2, 5, torch.zeros(3, 6))
    good = HeadGradient(1, 2, 5, torch.tensor(0.5), torch.ones(3, 6))
    check_head_gradient(good, 1, asked)
    big = torch.ones(3, 6)
    big[2, 5] = MAX_MAGNITUDE * 1.001
    for msg, why in [(Activation(1, 2, 5, torch.ones(3, 6), torch.arange(3)), "type: is Activation, expected HeadGradient"),
                     (HeadGradient(1, 2, 4, torch.tensor(0.5), torch.ones(3, 6)), "tags: are (device 1, round 2, step 4)"),
                     (HeadGradient(1, 2, 5, torch.tensor(0.5), torch.ones(4, 6)), "tensor: is torch.float32[4, 6], expected"),
                     (HeadGradient(1, 2, 5, torch.tensor(0.5), torch.ones(3, 6, dtype=torch.float64)), "tensor: is torch.float64"),
                     (HeadGradient(1, 2, 5, torch.ones(1), torch.ones(3, 6)), "loss: must be a scalar"),
                     (HeadGradient(1, 2, 5, torch.tensor(float("nan")), torch.ones(3, 6)), "loss: holds nan"),
                     (HeadGradient(1, 2, 5, torch.tensor(0.5), big), "tensor: holds 1e+10")]:
        with pytest.raises(BadMessageError, match=re.escape(f"device 1's head gradient: {why}")):
            check_head_gradient(msg, 1, asked)
    check_head_gradient(HeadGradient(1, 2, 5, torch.tensor(0.5), torch.full((3, 6), MAX_MAGNITUDE)), 1, asked)   # at the limit
