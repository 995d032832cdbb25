"""The MILP (34)/(35) of solvers/milfp.py encodes the spec's rows exactly: with the cut vector pinned, its
optimal value is N(x) = I·T_split(x) + T_agg(x) (+ λ·4β²γ²I³·A_{L_c} for the μ₅ cost), computed here by the
plain-Python reference — on heterogeneous cut vectors, asymmetric device rates and slow, asymmetric
edge↔fed links (so rows (23) and (25) bind with their own rate and the full payload N·μ₆ − Σδ)."""

import numpy as np
import pulp
import pytest

from adaptplan.system import SystemSpec
from solvers.milfp import MSModel
from solvers.problem import PlanningProblem
from tests import reference_model as ref
from tests.binding_instances import asymmetric_problem, parts


def _pinned_value(model, cuts, lam=0.0, weight=None):
    position = {int(c): k for k, c in enumerate(model.columns)}
    for i, row in enumerate(model.x):
        for k, var in enumerate(row):
            var.lowBound = var.upBound = 1.0 if k == position[cuts[i]] else 0.0
    model.set_lambda(lam, weight=weight)
    assert model.solve() == tuple(cuts)
    return pulp.value(model.prob.objective)


def _with_links(problem, edge_to_fed, fed_to_edge):
    profile, system, constants = parts(problem)
    system = SystemSpec(**{**system.__dict__, "edge_to_fed_bps": edge_to_fed, "fed_to_edge_bps": fed_to_edge})
    return PlanningProblem.from_parts(profile, system, constants)


#: (r_{e→f}, r_{f→e}) overrides: slow upload link, slow download link, or the instance's own (one slow, one fast).
LINKS = {"slow-edge-to-fed": (1e5, 1e9), "slow-fed-to-edge": (1e9, 1e5), "drawn": None}


@pytest.mark.parametrize("links", LINKS)
@pytest.mark.parametrize("seed", range(4))
def test_pinned_milp_value_is_the_reference_numerator(seed, links):
    problem = asymmetric_problem(seed + 40, num_devices=3, num_cuts=5)
    if LINKS[links] is not None:
        problem = _with_links(problem, *LINKS[links])
    profile, system, constants = parts(problem)
    rng = np.random.default_rng(seed)
    k_drift = 4 * constants.beta ** 2 * constants.gamma ** 2
    bound_hits = {"edge up": 0, "edge down": 0}
    for interval in (1, 3):
        model = MSModel(problem, interval)
        columns = model.columns.tolist()
        for _ in range(6):
            cuts = [int(c) for c in rng.choice(columns, size=3)]
            cuts[0], cuts[1] = columns[0], columns[-1]  # heterogeneous: S_n > 0
            terms = ref.stage_terms(profile, system, cuts)
            numerator = interval * terms["t_split"] + terms["t_agg"]
            assert _pinned_value(model, cuts) == pytest.approx(numerator, rel=1e-7)
            lam = 10.0
            drift = lam * k_drift * interval ** 3 * sum(constants.G2[:max(cuts)])
            assert _pinned_value(model, cuts, lam=lam) == pytest.approx(numerator + drift, rel=1e-7)
            bound_hits["edge up"] += terms["edge_model_up"] > max(terms["model_up"])
            bound_hits["edge down"] += terms["edge_model_down"] > max(terms["model_down"])
    if links == "slow-edge-to-fed":
        assert bound_hits == {"edge up": 12, "edge down": 0}
    elif links == "slow-fed-to-edge":
        assert bound_hits == {"edge up": 0, "edge down": 12}


def test_pinned_milp_with_a_fixed_deepest_cut():
    """The exact method's numerator MILP: μ₆ = δ_L fixed, weight w on the split stage, no μ₅."""
    problem = asymmetric_problem(7, num_devices=3, num_cuts=5)
    profile, system, _ = parts(problem)
    L = 3
    model = MSModel(problem, 1, max_cut=L, fixed_deepest=L, weight_only=True)
    for cuts in ([1, 1, 1], [1, 2, 3], [2, 2, 1]):
        terms = ref.stage_terms(profile, system, cuts)
        S_n = sum(profile.cut_points[L - 1].client_param_bits - profile.cut_points[l - 1].client_param_bits for l in cuts)
        t_agg = max(max(terms["model_up"]), S_n / system.edge_to_fed_bps) + max(max(terms["model_down"]),
                                                                                S_n / system.fed_to_edge_bps)
        assert _pinned_value(model, cuts, weight=2.5) == pytest.approx(2.5 * terms["t_split"] + t_agg, rel=1e-7)
