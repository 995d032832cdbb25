"""The profilers (profilers/): chain input contracts and block bookkeeping (the example input must be
a batch tensor, ``children`` needs an ``nn.Sequential``, blocks are numbered from 1, a parameter
shared between blocks is refused), user models by ``package.module:factory``, and the profile's
remaining behaviour."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import fx, nn

from adaptplan.errors import InputError
from profilers import build_chain
from profilers.chain import NoCutWarning, shape_failure
from profilers.cutpoints import assertion_nodes, dataflow_graph
from profilers.models import describe
from profilers.timing import measure_block_times


# ---- from test_profiler_contracts.py (merged by subject) ----------------------------------------
class Gate(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it (forces the Sequential fallback)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.sum() > 0 else -x


@pytest.mark.parametrize("example", [[1.0, 2.0], torch.tensor(3.0), None])
def test_example_input_must_be_a_batch_tensor(example):
    with pytest.raises(InputError, match=r"example_input: must be a tensor of shape \(batch, \*input_shape\)"):
        build_chain(nn.Sequential(nn.Linear(2, 2)), example)


def test_block_modes():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    chain = build_chain(model, torch.randn(2, 4), blocks="children")
    assert chain.names == ["0", "1", "2"] and chain.output_shapes == [(8,), (8,), (3,)]
    with pytest.raises(InputError, match="blocks='children' needs an nn.Sequential, got Linear"):
        build_chain(nn.Linear(4, 3), torch.randn(2, 4), blocks="children")
    with pytest.raises(InputError, match="blocks: must be one of auto, children, got 'layers'"):
        build_chain(model, torch.randn(2, 4), blocks="layers")


def test_traced_blocks_are_numbered_from_one():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    chain = build_chain(model, torch.randn(2, 4))
    names = [type(block).__name__ for block in chain.blocks]
    assert names == [f"Block{j}" for j in range(1, len(names) + 1)]


class TiedTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.fc(x)))


def test_shared_parameters_are_refused_with_block_numbers():
    with pytest.raises(InputError, match=r"model: parameter '.*weight' is used in blocks 1 and 2"):
        build_chain(TiedTwice(), torch.randn(1, 4))
    first, last = nn.Linear(4, 4), nn.Linear(4, 4)
    last.weight = first.weight  # tied weights in two different children
    sequential = nn.Sequential(first, Gate(), last)  # untraceable → children fallback, the gate joins `first`
    with pytest.raises(InputError, match=r"used in blocks 1 and 2.*untie"):
        build_chain(sequential, torch.randn(1, 4))
    with pytest.raises(InputError, match=r"used in blocks 1 and 3"):
        build_chain(sequential, torch.randn(1, 4), blocks="children")


def test_a_module_repeated_in_a_sequential_is_not_dropped():
    """nn.Sequential(a, gate, a) applies ``a`` twice: the chain must keep the second ``a`` (and so refuse
    the parameters shared by two blocks) instead of silently profiling a two-block model. As children the
    blocks are a, gate, a (1 and 3); the untraceable fallback joins the gate to the first a (1 and 2)."""
    shared = nn.Linear(4, 4)
    for blocks, pair in (("auto", "1 and 2"), ("children", "1 and 3")):
        with pytest.raises(InputError, match=rf"used in blocks {pair}"):
            build_chain(nn.Sequential(shared, Gate(), shared), torch.randn(2, 4), blocks=blocks)
    relu = nn.ReLU()  # a parameter-free module may repeat
    model = nn.Sequential(nn.Linear(4, 4), relu, nn.Linear(4, 2), relu)
    chain = build_chain(model, torch.randn(2, 4), blocks="children")
    assert chain.names == ["0", "1", "2", "3"]
    x = torch.randn(3, 4)
    assert torch.equal(chain.blocks(x), model(x))


class Functional(nn.Module):
    """Parameters applied through torch.nn.functional (get_attr + call_function), not submodules."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(6, 4))
        self.w2 = nn.Parameter(torch.randn(3, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, self.w1)), self.w2)


def test_functional_parameters_are_anchors():
    chain = build_chain(Functional(), torch.randn(2, 4))
    assert len(chain.blocks) == 2 and chain.output_shapes == [(6,), (3,)]
    x = torch.randn(5, 4)
    model = Functional()
    chain = build_chain(model, x)
    assert torch.allclose(chain.blocks(x), model(x))


class Narrow(nn.Module):
    """fc1's own output (2 values) is the narrowest tensor before fc2: the cut sits right at the anchor."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 2), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x).repeat(1, 4))


def test_the_anchor_output_itself_can_be_the_cut():
    chain = build_chain(Narrow(), torch.randn(2, 4))
    assert chain.names[0] == "fc1" and chain.output_shapes[0] == (2,)


def test_profiling_leaves_no_gradients_and_prints_nothing(capsys):
    from profilers import profile_model

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    profile = profile_model(model, (4,))
    assert all(p.grad is None for p in model.parameters())
    assert capsys.readouterr().out == ""  # the FLOP counters stay silent (stdout may carry JSON)


def test_iterate_batches_draws_disjoint_seeded_batches():
    from profilers.gradstats import iterate_batches

    x, y = torch.arange(20.0)[:, None], torch.arange(20)
    batches = list(iterate_batches(x, y, 4, 3, seed=1))
    assert len(batches) == 3 and all(b[0].shape == (4, 1) and b[1].shape == (4,) for b in batches)
    seen = torch.cat([b[1] for b in batches])
    assert len(set(seen.tolist())) == 12 and torch.equal(torch.cat([b[0][:, 0] for b in batches]).long(), seen)
    assert [b[1].tolist() for b in iterate_batches(x, y, 4, 3, seed=1)] == [b[1].tolist() for b in batches]
    assert [b[1].tolist() for b in iterate_batches(x, y, 4, 3, seed=2)] != [b[1].tolist() for b in batches]
    assert len(list(iterate_batches(x, y, 5, 4))) == 4  # exactly all 20 samples
    for size, count in ((0, 3), (4, 0)):
        with pytest.raises(InputError, match="must be ≥ 1"):
            list(iterate_batches(x, y, size, count))
    with pytest.raises(InputError, match="need 21 samples but the data has 20"):
        list(iterate_batches(x, y, 7, 3))


def test_estimated_constants_default_to_the_spec_placeholders_for_gamma_and_epsilon():
    """γ and ε are passed through; their defaults are the §6.1 placeholders γ = 0.01, ε = 0.1."""
    from profilers.gradstats import estimate_constants, iterate_batches

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    x, y = torch.randn(24, 4), torch.randint(0, 3, (24,))
    constants = estimate_constants(model, list(iterate_batches(x, y, 4, 3)), num_batches=3, beta_steps=2, beta_batches=1)
    assert (constants.gamma, constants.epsilon) == (0.01, 0.1)
    assert constants.num_cuts == 2 and constants.beta > 0 and constants.theta > 0


class GateBN(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.sum() > 0 else -x


def test_building_a_chain_does_not_touch_batchnorm_statistics():
    """The shape pass runs in eval mode (traced or Sequential fallback): running stats stay untouched and the
    model's training flags are restored."""
    for model in (nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), GateBN(), nn.Linear(6, 2)),   # fallback
                  nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))):  # traced
        model.train()
        build_chain(model, torch.randn(8, 4) * 5 + 3)
        bn = model[1]
        assert int(bn.num_batches_tracked) == 0 and torch.equal(bn.running_mean, torch.zeros(6))
        assert all(m.training for m in model.modules())


def test_values_per_sample_drops_the_batch_dimension():
    from torch import fx
    from torch.fx.passes.shape_prop import ShapeProp

    from profilers.cutpoints import values_per_sample

    gm = fx.symbolic_trace(nn.Sequential(nn.Linear(4, 6), nn.Flatten()))
    ShapeProp(gm).propagate(torch.randn(5, 3, 4))
    sizes = {str(n.target): values_per_sample(n) for n in gm.graph.nodes if n.op == "call_module"}
    assert sizes == {"0": 18, "1": 18}  # (5, 3, 6) and (5, 18) per sample: 3·6


def _tiny_data(count=3):
    torch.manual_seed(1)
    x, y = torch.randn(4 * count, 4), torch.randint(0, 3, (4 * count,))
    return [(x[4 * k:4 * k + 4], y[4 * k:4 * k + 4]) for k in range(count)]


def test_estimate_constants_validates_its_inputs():
    from profilers.gradstats import estimate_constants

    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    for name in ("gamma", "epsilon", "beta_radius"):
        for bad in (0, -1.0, math.nan, math.inf, "0.1"):
            with pytest.raises(InputError, match=f"{name}: must be a finite number > 0"):
                estimate_constants(model, _tiny_data(), **{name: bad})
    two = estimate_constants(model, _tiny_data(2), num_batches=2, beta_steps=1)  # two batches are enough
    assert two.num_cuts == 2
    with pytest.raises(InputError, match="batches: need at least 2 mini-batches"):
        estimate_constants(model, _tiny_data(1))
    with pytest.raises(InputError, match="model: the model has no parameters"):
        estimate_constants(nn.Sequential(nn.ReLU(), nn.Flatten()), _tiny_data())


def test_beta_uses_at_least_one_batch():
    from profilers.gradstats import estimate_constants

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    one = estimate_constants(model, _tiny_data(), beta_batches=1, beta_steps=3)
    none = estimate_constants(model, _tiny_data(), beta_batches=0, beta_steps=3)
    assert none.beta == pytest.approx(one.beta, rel=1e-12) and one.beta > 0
    zero_steps = estimate_constants(model, _tiny_data(), beta_batches=1, beta_steps=0)
    single_step = estimate_constants(model, _tiny_data(), beta_batches=1, beta_steps=1)
    assert zero_steps.beta == pytest.approx(single_step.beta, rel=1e-12) and zero_steps.beta > 0  # ≥ 1 iteration


def test_named_models_default_to_ten_classes():
    from profilers.models import resolve_model

    model = resolve_model("resnet18")
    assert model.fc.out_features == 10
    assert resolve_model("resnet18", num_classes=7).fc.out_features == 7


def not_a_module(num_classes=10):
    """A user factory that returns the wrong kind of object (used by the test below)."""
    return {"classes": num_classes}


def test_named_model_num_classes_and_factory_result_are_checked():
    from profilers.models import resolve_model

    assert resolve_model("resnet18", num_classes=1).fc.out_features == 1  # one class is allowed
    with pytest.raises(InputError, match="--num-classes: must be ≥ 1, got 0"):
        resolve_model("resnet18", num_classes=0)
    with pytest.raises(InputError, match=r"MODEL: tests.profilers.test_profilers:not_a_module returned dict, not a torch.nn.Module"):
        resolve_model("tests.profilers.test_profilers:not_a_module")


def test_the_first_block_never_computes_an_input_gradient():
    """ϖ_1 has the weight gradient only (the device never needs ∂ℓ/∂x of block 1): for a bias-free Linear
    that is as many FLOPs as its forward pass; later blocks add the input gradient."""
    from profilers import profile_model

    model = nn.Sequential(nn.Linear(4, 8, bias=False), nn.ReLU(), nn.Linear(8, 3, bias=False))
    profile = profile_model(model, (4,))
    assert profile.num_cuts == 2
    assert profile.varpi[0] == profile.rho[0]
    second_fp = profile.rho[1] - profile.rho[0]
    assert profile.varpi[1] - profile.varpi[0] == 2 * second_fp  # weight + input gradient of block 2


class _Clock:
    """A fake ``time`` module: every forward pass takes ``fp`` s and every backward pass ``bp`` s."""

    def __init__(self, fp, bp):
        self.now, self.steps, self.k = 0.0, (fp, bp, 0.0), 0

    def perf_counter(self):
        value = self.now
        self.now += self.steps[self.k % 3]
        self.k += 1
        return value


class Recorder(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.modes, self.backward_calls = [], 0
        self.fc.weight.register_hook(self._count)

    def _count(self, grad):
        self.backward_calls += 1
        return grad

    def forward(self, x):
        self.modes.append(self.training)
        return self.fc(x)


def test_block_times_are_medians_per_sample_in_training_mode(monkeypatch, capsys):
    import profilers.timing as timing

    monkeypatch.setattr(timing, "time", _Clock(fp=0.8, bp=2.4))
    blocks = [Recorder(4), Recorder(4)]
    for block in blocks:
        block.eval()
    times = timing.measure_block_times(blocks, (4,), repeats=3, warmup=1)
    assert times.batch_size == 16 and times.timing_info() == {"batch_size": 16, "repeats": 3,
                                                              "threads": torch.get_num_threads(), "statistic": "median"}
    assert times.forward_s == pytest.approx((0.8 / 16, 0.8 / 16)) and times.backward_s == pytest.approx((2.4 / 16,) * 2)
    assert blocks[0].backward_calls == 4 and blocks[1].backward_calls == 4  # warm-up + 3 timed passes, all backward
    assert all(blocks[0].modes) and all(blocks[1].modes)  # measured in training mode …
    assert not blocks[0].training and not blocks[1].training  # … and the modes restored
    assert all(p.grad is None for block in blocks for p in block.parameters())
    assert capsys.readouterr().err == ""  # no progress bar unless asked
    with pytest.raises(InputError, match="batch_size: must be ≥ 2"):
        timing.measure_block_times(blocks, (4,), batch_size=1)
    with pytest.raises(InputError, match="repeats: must be ≥ 1"):
        timing.measure_block_times(blocks, (4,), repeats=0)


# ---- from test_profiler_fresh.py (merged by subject) ----------------------------------------
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
