"""docs/api.md's Python snippets run as written, in order, as one script (each sees the names the ones above it
made), in an empty folder that holds only the model module the page shows (examples/mymodels.py, which the page
quotes whole)."""

import sys
from pathlib import Path

import pytest

from tests.readme_blocks import python_snippets

ROOT = Path(__file__).resolve().parents[2]
API = "docs/api.md"
MODULE_MARK = "# mymodels.py"
"""The first line of the snippet that is a file (the model module), not code to run."""
EXCERPT_MARK = "# examples/plan_in_own_loop.py, main()"
"""The first line of the snippet quoted from an example's main() (run by tests/project/test_examples.py), not run here."""


def test_the_page_quotes_the_model_module_of_the_examples_whole() -> None:
    modules = [s for s in python_snippets(API) if s.startswith(MODULE_MARK)]
    assert modules == [(ROOT / "examples" / "mymodels.py").read_text(encoding="utf-8")]


def test_the_own_loop_snippet_is_the_example_s_code_as_it_is() -> None:
    import textwrap

    excerpts = [s for s in python_snippets(API) if s.startswith(EXCERPT_MARK)]
    assert len(excerpts) == 1
    body = excerpts[0].split("\n", 1)[1]
    source = (ROOT / "examples" / "plan_in_own_loop.py").read_text(encoding="utf-8")
    assert len(body.splitlines()) >= 20 and textwrap.indent(body, "    ") in source


def test_api_snippets_run_in_order_as_written(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "mymodels.py").write_text((ROOT / "examples" / "mymodels.py").read_text(encoding="utf-8"),
                                          encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))          # as `python script.py` run from that folder would have it
    monkeypatch.delitem(sys.modules, "mymodels", raising=False)
    scope = {"__name__": "__api_md__"}
    code = [s for s in python_snippets(API) if not s.startswith((MODULE_MARK, EXCERPT_MARK))]
    assert len(code) >= 4
    for index, snippet in enumerate(code, start=1):
        exec(compile(snippet, f"docs/api.md python snippet {index}", "exec"), scope)
    out = capsys.readouterr().out
    assert "plan: the plan is for 6 devices (one cut each) but devices = 4" in out
    plan, config = scope["plan"], scope["config"]
    assert len(plan.cuts) == 6 and (config.plan.cuts, config.plan.interval) == (plan.cuts, plan.interval)
    assert config.model.name == "mymodels:SmallNet" and config.data.devices == 6
    assert scope["history"].meta["config"]["algorithm"] == "psl"        # the last snippet read runs/psl back
    fit, to_30 = scope["fit"], scope["to_30"]                            # the model's R at each pilot's plan is its own
    assert fit.fitted_rounds == pytest.approx((42.9, 55.0), rel=1e-9) and fit.kappa > 0
    assert f"{to_30.cuts} {to_30.interval} {to_30.rounds}" in out


# ---- what the page promises beside its snippets ------------------------------------------------------------------
def a_plan(devices: int = 4):
    """The planner's plan for docs/model.md §6.1's VGG-16 profile on ``devices`` generated devices."""
    from dataclasses import replace

    from adaptplan import ConvergenceConstants, Planner, generate_system
    from adaptplan.scenarios import default_profile

    profile = default_profile()
    constants = replace(ConvergenceConstants.placeholder(profile.num_cuts), epsilon=0.5)
    return Planner(profile, generate_system(devices, seed=0), constants).plan()


def test_a_plan_gives_the_run_its_cuts_interval_and_devices_and_interval_overrides_it() -> None:
    from adaptplan import TrainConfig

    plan = a_plan()
    config = TrainConfig.flat(dataset="synthetic", model="mlp", plan=plan)
    assert (config.data.devices, config.plan.cuts, config.plan.interval) == (4, plan.cuts, plan.interval)
    assert TrainConfig.flat(dataset="synthetic", model="mlp", plan=plan, interval=7).plan.interval == 7
    assert config.to_json()["cuts"] == list(plan.cuts)                # the run folder stores what it trained with


@pytest.mark.parametrize(("given", "text"), [
    ({"devices": 5}, "the plan is for 4 devices (one cut each) but devices = 5: train with devices=4"),
    ({"cuts": [1]}, "cuts= decides the cuts too: give either plan= or cuts=, not both"),
    ({"plan_path": "plan.json"}, "plan_path= decides the cuts too"),
    ({"policy": "psl"}, "policy= decides the cuts too"),
])
def test_a_plan_that_does_not_fit_the_run_is_one_message_naming_plan(given, text) -> None:
    from adaptplan import InputError, TrainConfig

    with pytest.raises(InputError) as caught:
        TrainConfig.flat(dataset="synthetic", model="mlp", plan=a_plan(), **given)
    assert caught.value.field == "plan" and text in caught.value.message


def test_a_plan_file_path_given_as_plan_says_where_it_goes() -> None:
    from adaptplan import InputError, TrainConfig

    with pytest.raises(InputError, match=r"^plan: must be a Plan .* got str; a plan file goes as plan_path='p.json'"):
        TrainConfig.flat(plan="p.json")


def test_a_plan_cut_beyond_the_model_stops_the_run_before_its_first_round() -> None:
    from adaptplan import InputError, TrainConfig, train

    plan = a_plan(2)
    assert max(plan.cuts) > 3                                          # the mlp has 3 cut points
    with pytest.raises(InputError, match=r"cuts\[0\]: cut \d+ is outside 1\.\.3"):
        train(TrainConfig.flat(dataset="synthetic", model="mlp", plan=plan, rounds=1, progress=False))


def test_a_factory_with_a_parameter_nothing_fills_is_refused_naming_model(tmp_path, monkeypatch) -> None:
    from adaptplan import InputError, TrainConfig

    (tmp_path / "api_factories.py").write_text(
        "from torch import nn\n\n"
        "def make_net(in_channels, num_classes):\n    return nn.Linear(in_channels, num_classes)\n\n"
        "def keyword_only(*, num_classes, hidden=8):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.Linear(hidden, num_classes))\n",
        encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "api_factories", raising=False)
    with pytest.raises(InputError) as caught:
        TrainConfig.flat(dataset="synthetic", model="api_factories:make_net")
    assert caught.value.field == "model"
    assert caught.value.message.startswith("api_factories:make_net(in_channels, num_classes) needs in_channels, which "
                                           "nothing passes: a model factory is called as factory(num_classes=M)")
    import torch

    from profilers.models import resolve_model

    assert resolve_model("api_factories:keyword_only", num_classes=3)(torch.zeros(2, 1, 8, 8)).shape == (2, 3)
