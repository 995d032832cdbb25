"""One convention per comparison, stated (issue 69 item 4): every recipe gives all its methods one optimizer-state
convention with its source, printed with the setting; GAPSL's recipe states its server step."""

from __future__ import annotations

import pytest

from adaptplan.benches.recipes import NAMES, load
from adaptplan.errors import InputError

STATED = {"gapsl": "keep", "scala": "restart", "cyclesl": "keep", "gas": "restart", "adaptsfl": "keep",
          "gas-fmnist": "restart", "cyclesl-shakespeare": "keep"}


@pytest.mark.parametrize("name", NAMES)
def test_every_recipe_states_one_optimizer_state_convention(name: str) -> None:
    recipe = load(name)
    assert recipe.setting.client_state == STATED[name]
    assert recipe.setting.sources["client_state"].strip()
    assert (f"optimizer state {'kept' if STATED[name] == 'keep' else 'restarted'} when it loads the global model"
            in recipe.setting.describe())
    for job in recipe.jobs([0]):
        assert job["config"]["client_state"] == STATED[name], job["label"]     # every method, one convention


def test_gapsl_states_its_server_step() -> None:
    recipe = load("gapsl")
    steps = {m.label: m.options.get("server_step") for m in recipe.methods if m.algorithm == "gapsl"}
    assert steps == {"gapsl": "mean", "non-lgi": "mean", "rand-lgi": "mean"}


def test_a_comparison_refuses_each_algorithms_own_convention() -> None:
    from adaptplan.benches.comparison import GAPSL_SETTING

    with pytest.raises(InputError, match="a comparison gives every method one convention: keep or restart") as info:
        GAPSL_SETTING.with_overrides(client_state="algorithm")
    assert info.value.field == "--client-state"
    assert GAPSL_SETTING.with_overrides(client_state="restart").fields("sfl-v1", 4)["client_state"] == "restart"
