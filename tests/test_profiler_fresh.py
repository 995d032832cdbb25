"""Profiler behaviour found untested by a fresh mutation sample (docs/mutation.md)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import fx, nn

from adaptplan.errors import InputError

from profilers.chain import NoCutWarning, build_chain, shape_failure
from profilers.cutpoints import assertion_nodes, dataflow_graph
from profilers.models import describe
from profilers.timing import measure_block_times


def test_a_shape_failure_names_the_per_sample_shape_and_the_channels_last_fix() -> None:
    batch = torch.zeros(2, 32, 32, 3)                       # two samples given as H×W×C
    message = shape_failure(batch, RuntimeError("expected 3 channels\nmore detail"))
    assert message == ("the model cannot run on samples of shape 32x32x3 (the --input given, or the dataset's "
                       "samples): RuntimeError: expected 3 channels. Fix: 32x32x3 looks channels-last; the input "
                       "is channels × height × width, e.g. 3x32x32")
    plain = shape_failure(torch.zeros(4, 3, 8, 8), ValueError(""))
    assert plain == ("the model cannot run on samples of shape 3x8x8 (the --input given, or the dataset's samples): "
                     "ValueError: . Fix: check the input shape (channels × height × width)")


def test_children_mode_takes_a_one_child_sequential_without_a_no_cut_warning() -> None:
    """blocks='children' uses the user's blocks as given; only the automatic fallback warns."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoCutWarning)
        chain = build_chain(nn.Sequential(nn.Linear(4, 2)), torch.zeros(1, 4), blocks="children")
    assert len(chain) == 1


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        torch._assert(x.shape[1] == 4, "four features")
        return self.lin(x * self.scale)


def test_the_dataflow_graph_leaves_out_attributes_the_output_and_run_time_checks() -> None:
    graph = fx.symbolic_trace(_Scaled()).graph
    ops = {n.name: n.op for n in graph.nodes}
    assert "get_attr" in ops.values() and "output" in ops.values()
    dag = dataflow_graph(graph)
    kept = {n.name for n in dag.nodes}
    skipped = {n.name for n in assertion_nodes(graph)}
    assert skipped and not kept & skipped
    assert all(ops[name] not in ("get_attr", "output") for name in kept)
    assert {"x", "mul", "lin"} <= kept
    assert {(u.name, v.name) for u, v in dag.edges} >= {("x", "mul"), ("mul", "lin")}


def test_describe_is_one_short_line() -> None:
    assert describe(ValueError("bad\n   width")) == "ValueError: bad width"
    assert describe(KeyError()) == "KeyError"
    assert describe(RuntimeError("x" * 400)) == "RuntimeError: " + "x" * 300


def test_block_times_need_two_samples_per_batch() -> None:
    blocks = [nn.Linear(3, 3), nn.Linear(3, 2)]
    times = measure_block_times(blocks, (3,), batch_size=2, repeats=1, warmup=0)
    assert len(times.forward_s) == len(times.backward_s) == 2 and times.batch_size == 2
    with pytest.raises(InputError, match=r"^batch_size: must be ≥ 2 \(BatchNorm needs 2 samples in training mode\), got 1$"):
        measure_block_times(blocks, (3,), batch_size=1)
