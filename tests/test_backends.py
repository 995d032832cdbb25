"""MILP backends: HiGHS is the default and always there; CBC is optional and its absence is one
clear message (exit 2), not a traceback from PuLP."""

import pytest

from adaptplan.cli import main
from adaptplan.errors import InputError
from solvers import milfp


def test_unknown_backend_is_an_input_error():
    with pytest.raises(InputError, match="backend: must be one of highs, cbc"):
        milfp.check_backend("gurobi")


def test_highs_is_always_available():
    assert milfp.check_backend("highs") == "highs"


def test_missing_cbc_is_one_message_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(milfp, "_cbc_solver_class", lambda: None)
    assert main(["plan", "--backend", "cbc"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CBC is not available" in err[0] and "highs" in err[0], err


def test_missing_cbc_refused_even_where_no_milp_is_solved(monkeypatch):
    """The Planner checks the backend up front, not only when the MILP path runs."""
    from adaptplan import Planner
    from adaptplan.scenarios import default_scenario

    monkeypatch.setattr(milfp, "_cbc_solver_class", lambda: None)
    s = default_scenario()
    with pytest.raises(InputError, match="CBC"):
        Planner(s.profile, s.system, s.constants, backend="cbc")
