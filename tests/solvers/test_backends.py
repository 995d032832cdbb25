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


class _FakeCBC:
    def __init__(self, works: bool, constructs: bool = True) -> None:
        self.works, self.constructs = works, constructs

    def __call__(self, msg: bool = False) -> "_FakeCBC":
        if not self.constructs:
            raise OSError("no cbc binary")
        return self

    def available(self) -> bool:
        return self.works


def test_cbc_interface_is_the_first_available_one(monkeypatch):
    bundled, system = _FakeCBC(True), _FakeCBC(True)
    monkeypatch.setattr(milfp.pulp, "PULP_CBC_CMD", bundled)
    monkeypatch.setattr(milfp.pulp, "COIN_CMD", system)
    assert milfp._cbc_solver_class() is bundled
    monkeypatch.setattr(milfp.pulp, "PULP_CBC_CMD", _FakeCBC(False))
    assert milfp._cbc_solver_class() is system
    monkeypatch.setattr(milfp.pulp, "PULP_CBC_CMD", _FakeCBC(True, constructs=False))   # broken interface: skipped
    assert milfp._cbc_solver_class() is system
    monkeypatch.setattr(milfp.pulp, "COIN_CMD", _FakeCBC(False))
    assert milfp._cbc_solver_class() is None


def test_cbc_solves_the_same_ms_step_as_highs_where_installed():
    if milfp._cbc_solver_class() is None:
        pytest.skip("no CBC here")
    from solvers.dinkelbach import solve_dinkelbach
    from tests.solver_instances import small_problem

    problem = small_problem(3)
    highs, cbc = solve_dinkelbach(problem, 2), solve_dinkelbach(problem, 2, backend="cbc")
    assert cbc.status == "converged" and cbc.objective == pytest.approx(highs.objective, rel=1e-6)
