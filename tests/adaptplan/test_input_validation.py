"""User-facing input validation on the planner side: the error type's parts, number/list validators, profile
invariants (equal consecutive cumulative values are valid: parameter-free blocks), and the messages the
commands print besides their output."""

import json
import math

import pytest

from adaptplan.cli import main
from adaptplan.errors import InfeasibleError, InputError
from adaptplan.fileio import check_keys, finite_number, non_empty_list, non_negative_number, positive_int, positive_number
from adaptplan.model_profile import CutPoint, ModelProfile
from adaptplan.system import SystemSpec, generate_system


def test_input_error_keeps_field_and_message_apart():
    error = InputError("must be > 0, got 0", field="system.server_flops")
    assert (error.field, error.message) == ("system.server_flops", "must be > 0, got 0")
    assert str(error) == "system.server_flops: must be > 0, got 0"
    plain = InputError("no field")
    assert (plain.field, plain.message, str(plain)) == (None, "no field", "no field")
    assert isinstance(InfeasibleError("x"), InputError) and isinstance(plain, ValueError)


@pytest.mark.parametrize("value", ["3", None, [1], True, False, {"a": 1}])
def test_numbers_must_be_real_numbers(value):
    for check in (finite_number, positive_number, non_negative_number):
        with pytest.raises(InputError, match="f: must be a number"):
            check(value, "f")


def test_number_validators_bounds():
    assert finite_number(-2, "f") == -2.0 and isinstance(finite_number(3, "f"), float)
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(InputError, match="must be a finite number"):
            finite_number(bad, "f")
    with pytest.raises(InputError, match="at most 1e\\+30 in magnitude"):
        finite_number(-1e31, "f")
    assert positive_number(1e-30, "f") == 1e-30          # the smallest supported positive value (README limits)
    with pytest.raises(InputError, match="at least 1e-30"):
        positive_number(1e-300, "f")
    with pytest.raises(InputError, match="must be > 0, got 0"):
        positive_number(0, "f")
    assert non_negative_number(0, "f") == 0.0
    with pytest.raises(InputError, match="must be ≥ 0"):
        non_negative_number(-1e-300, "f")
    assert positive_int(1, "n") == 1
    for bad in (0, -3, 1.5, "2", True):
        with pytest.raises(InputError, match="n: must be an integer ≥ 1"):
            positive_int(bad, "n")
    assert non_empty_list([0], "l") == [0]
    for bad in ([], (1,), "ab", None):
        with pytest.raises(InputError, match="l: must be a non-empty list"):
            non_empty_list(bad, "l")


def test_check_keys_names_missing_and_unknown_keys():
    check_keys({"a": 1, "b": 2}, ["a"], ["b"], "w")
    with pytest.raises(InputError, match="w: missing required key 'a'"):
        check_keys({"b": 2}, ["a"], ["b"], "w")
    with pytest.raises(InputError, match=r"w: unknown key 'c' \(allowed: a, b\)"):
        check_keys({"a": 1, "c": 3}, ["a"], ["b"], "w")
    with pytest.raises(InputError, match="w: expected an object, got list"):
        check_keys([1], ["a"], [], "w")


def _profile(delta):
    cuts = tuple(CutPoint(index=j + 1, name=f"b{j + 1}", fp_flops=float(j + 1), bp_flops=2.0 * (j + 1),
                          activation_bits=8.0, gradient_bits=8.0, client_param_bits=float(d))
                 for j, d in enumerate(delta))
    return ModelProfile(model="m", input_shape=(1,), bits_per_value=32, cut_points=cuts)


def test_profile_accepts_equal_cumulative_values_and_rejects_decreasing_ones():
    profile = _profile([10.0, 10.0, 10.5, 10.5])  # parameter-free blocks (ReLU, pooling) repeat δ_j
    assert profile.delta.tolist() == [10.0, 10.0, 10.5, 10.5]
    with pytest.raises(InputError, match=r"cut_points.client_param_bits: must be cumulative"):
        _profile([10.0, 9.5])
    cuts = _profile([1.0, 2.0]).cut_points
    with pytest.raises(InputError, match=r"cut_points\[1\].index: indices must be 1..L in order; found 3 at position 2"):
        ModelProfile(model="m", input_shape=(1,), bits_per_value=32,
                     cut_points=(cuts[0], CutPoint(**{**cuts[1].__dict__, "index": 3})))
    with pytest.raises(InputError, match="cut_points: must list at least one cut point"):
        ModelProfile(model="m", input_shape=(1,), bits_per_value=32, cut_points=())


def test_server_bp_flops_used_only_when_every_cut_has_it():
    profile = _profile([1.0, 2.0, 3.0])
    assert profile.server_bp.tolist() == [4.0, 2.0, 0.0]  # ϖ_L − ϖ_j
    full = ModelProfile(model="m", input_shape=(1,), bits_per_value=32, cut_points=tuple(
        CutPoint(**{**c.__dict__, "server_bp_flops": 7.0 - c.index}) for c in profile.cut_points))
    assert full.server_bp.tolist() == [6.0, 5.0, 4.0]
    partial = ModelProfile(model="m", input_shape=(1,), bits_per_value=32, cut_points=(
        CutPoint(**{**profile.cut_points[0].__dict__, "server_bp_flops": 9.0}),) + profile.cut_points[1:])
    assert partial.server_bp.tolist() == [4.0, 2.0, 0.0]


def test_system_command_says_what_it_wrote(tmp_path, capsys):
    out = tmp_path / "sub" / "s.toml"
    assert main(["system", "--devices", "3", "--seed", "1", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == f"wrote {out} (3 devices)"
    assert SystemSpec.load(out) == generate_system(3, 1)
    assert main(["system", "--devices", "0"]) == 2
    assert "--devices: must be an integer in 1..10,000 devices, got 0" in capsys.readouterr().err


def test_cli_reports_input_errors_in_one_line(tmp_path, capsys):
    bad = tmp_path / "system.json"
    data = generate_system(2, 0).to_json()
    data["devices"][1]["fed_down_bps"] = -5
    bad.write_text(json.dumps(data))
    assert main(["plan", "--system", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "system.json: system.devices[1].fed_down_bps: must be > 0 bit/s, got -5" in err[0]


def test_cut_vectors_are_checked_by_entry(toy_profile, toy_system):
    from adaptplan.latency import LatencyModel

    model = LatencyModel(toy_profile, toy_system)
    for cuts, message in (([0, 1], r"cuts\[0\]: cut 0 is outside 1..3"), ([1, 4], r"cuts\[1\]: cut 4 is outside 1..3"),
                          ([1], r"cuts: need one cut per device \(2\), got 1"), ([1, 2, 3], "need one cut per device")):
        for evaluate in (model.breakdown, model.t_split, model.t_agg):
            with pytest.raises(InputError, match=message):
                evaluate(cuts)
    assert model.breakdown([3, 1]).t_split > 0


def test_profile_file_keys_are_checked(tmp_path):
    data = _profile([1.0, 2.0]).to_json()
    assert ModelProfile.from_json(data) == _profile([1.0, 2.0])
    for mutate, message in ((lambda d: d.update(colour="red"), "profile: unknown key 'colour'"),
                            (lambda d: d.pop("model"), "profile: missing required key 'model'"),
                            (lambda d: d.update(timing=[1]), "profile.timing: must be an object"),
                            (lambda d: d.update(flop_convention="1 per multiply-add"), "flop_convention: only"),
                            (lambda d: d["cut_points"][1].pop("gradient_bits"),
                             r"profile.cut_points\[1\]: missing required key 'gradient_bits'"),
                            (lambda d: d["cut_points"][0].update(fp_flops=-1.0), r"cut_points\[0\].fp_flops: must be ≥ 0")):
        bad = json.loads(json.dumps(data))
        mutate(bad)
        with pytest.raises(InputError, match=message):
            ModelProfile.from_json(bad)


def test_system_spec_validates_every_field_when_constructed(toy_system):
    for field, value in (("batch_size", 0), ("batch_size", 2.5), ("server_flops", 0.0), ("edge_to_fed_bps", -1.0),
                         ("fed_to_edge_bps", 0.0)):
        with pytest.raises(InputError, match=f"system.{field}: must be"):
            SystemSpec(**{**toy_system.__dict__, field: value})
    with pytest.raises(InputError, match="system.devices: must list at least one device"):
        SystemSpec(**{**toy_system.__dict__, "devices": ()})
    from adaptplan.system import DeviceSpec

    for name in ("flops", "up_bps", "down_bps", "fed_up_bps", "fed_down_bps"):
        bad = DeviceSpec(**{**toy_system.devices[1].__dict__, name: 0.0})
        with pytest.raises(InputError, match=rf"system.devices\[1\].{name}: must be > 0"):
            SystemSpec(**{**toy_system.__dict__, "devices": (toy_system.devices[0], bad)})


def test_unwritable_output_path_exits_2_with_one_message(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["system", "--devices", "2", "-o", str(blocker / "s.json")]) == 2  # parent is a file: OSError
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("adaptplan system: error: output: cannot write")


def test_plan_json_on_stdout_is_one_document_ending_in_a_newline(capsys):
    assert main(["plan", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("}\n") and not out.endswith("\n\n")
    assert json.loads(out)["interval"] >= 1


def test_lazy_package_attributes():
    import adaptplan

    assert adaptplan.Planner.__name__ == "Planner"
    with pytest.raises(AttributeError, match="module 'adaptplan' has no attribute 'Nope'"):
        adaptplan.Nope  # noqa: B018
    assert not hasattr(adaptplan, "Nope")
    from adaptplan import History, RoundRecord, TrainConfig, train       # docs/api.md's names (issue 37 item 3)
    from trainers.config.train_config import TrainConfig as Config
    from trainers.run.driver import run
    from trainers.run.history import History as Records

    assert (TrainConfig, History, train) == (Config, Records, run) and RoundRecord.__name__ == "RoundRecord"
    assert set(adaptplan.__all__) >= {"TrainConfig", "History", "train", "profile_model", "estimate_constants",
                                      "build_chain", "Planner", "generate_system"}


@pytest.mark.parametrize("value", [["adam"], {"name": "adam"}, 3, None, "x" * 1_000_000])
def test_a_profile_memory_optimizer_of_another_kind_is_one_short_message(value) -> None:
    """A list or an object there used to be an internal error (unhashable type); a huge value is not echoed whole."""
    import json as _json  # noqa: F811

    from adaptplan.errors import InputError as _InputError
    from adaptplan.model_profile import ModelProfile
    from adaptplan.scenarios import default_profile

    data = _json.loads(_json.dumps(default_profile().to_json()))
    data["memory"] = {"batch_size": 16, "optimizer": value}
    for cut in data["cut_points"]:
        cut.setdefault("client_memory_bytes", 1000.0)
    with pytest.raises(_InputError) as info:
        ModelProfile.from_json(data)
    assert info.value.field == "memory.optimizer" and len(info.value.message) < 200
