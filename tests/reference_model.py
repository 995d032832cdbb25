"""An independent, plain-Python reference of the world model (docs/model.md §2.2–§4.2).

Written from the spec equation by equation; it reads only the raw fields of the profile's cut
points, the system's devices and the constants — never ``LatencyModel``, ``ConvergenceModel``,
``PlanningProblem`` or numpy — so the tests can compare the package (vectorised and scalar
paths, every solver) against something that shares no code with it. Units: seconds, bits, FLOPs.

Cut vectors are 1-based cut indices ℓ_i, one per device (x_{i,ℓ_i} = 1).
"""

from __future__ import annotations

import math
from itertools import product


def _cut(profile, j):
    """The cut point with index j (1-based)."""
    return profile.cut_points[j - 1]


def _server_bp_flops(profile, j):
    """ϖ_L − ϖ_j (eq. (19)), or the profile's explicit server BP FLOPs for cut j when every cut point gives
    them (docs/formats.md: a partial column is ignored)."""
    if all(p.server_bp_flops is not None for p in profile.cut_points):
        return _cut(profile, j).server_bp_flops
    return profile.cut_points[-1].bp_flops - _cut(profile, j).bp_flops


def stage_terms(profile, system, cuts):
    """Every term of eqs. (16)–(25) and the two stage latencies of §2.4, as a dict of floats/lists."""
    b = system.batch_size
    devices = system.devices
    assert len(cuts) == len(devices)
    L = len(profile.cut_points)
    rho_L = profile.cut_points[L - 1].fp_flops
    t_F, t_A, t_G, t_B, t_mU, t_mD = [], [], [], [], [], []
    server_fp = server_bp = 0.0
    for device, l in zip(devices, cuts):
        p = _cut(profile, l)
        t_F.append(b * p.fp_flops / device.flops)                     # (16) T_i^F = b ρ_ℓ / f_i
        t_A.append(b * p.activation_bits / device.up_bps)             # (17) T_i^A = b ψ_ℓ / r_i^U
        server_fp += b * (rho_L - p.fp_flops) / system.server_flops   # (18) T_s^F = Σ_i b(ρ_L − ρ_ℓi)/f_s
        server_bp += b * _server_bp_flops(profile, l) / system.server_flops  # (19) T_s^B = Σ_i b(ϖ_L − ϖ_ℓi)/f_s
        t_G.append(b * p.gradient_bits / device.down_bps)             # (20) T_i^G = b χ_ℓ / r_i^D
        t_B.append(b * p.bp_flops / device.flops)                     # (21) T_i^B = b ϖ_ℓ / f_i
        t_mU.append(p.client_param_bits / device.fed_up_bps)          # (22) T_i^{mU} = δ_ℓ / r_i^{fU}
        t_mD.append(p.client_param_bits / device.fed_down_bps)        # (24) T_i^{mD} = δ_ℓ / r_i^{fD}
    L_c = max(cuts)
    S_n = sum(_cut(profile, L_c).client_param_bits - _cut(profile, l).client_param_bits for l in cuts)  # §2.3
    t_eU = S_n / system.edge_to_fed_bps                               # (23) T_e^{mU} = S_n / r_{e→f}
    t_eD = S_n / system.fed_to_edge_bps                               # (25) T_e^{mD} = S_n / r_{f→e}
    fp_up = max(f + a for f, a in zip(t_F, t_A))
    down_bp = max(g + bp for g, bp in zip(t_G, t_B))
    t_split = fp_up + server_fp + server_bp + down_bp                # §2.4 T_split
    t_agg = max(max(t_mU), t_eU) + max(max(t_mD), t_eD)              # §2.4 T_agg
    return {"client_fp": t_F, "upload": t_A, "server_fp": server_fp, "server_bp": server_bp, "download": t_G,
            "client_bp": t_B, "model_up": t_mU, "edge_model_up": t_eU, "model_down": t_mD, "edge_model_down": t_eD,
            "fp_upload_max": fp_up, "download_bp_max": down_bp, "t_split": t_split, "t_agg": t_agg,
            "non_common_bits": S_n}


def c_value(constants, num_devices):
    """c = ε − (βγ/N) Σ_{j=1}^{L} σ_j² (§3 shorthand)."""
    return constants.epsilon - constants.beta * constants.gamma * sum(constants.sigma2) / num_devices


def d_value(constants, deepest_cut):
    """d = 4β²γ² A_{L_c}, A_ℓ = Σ_{j≤ℓ} G_j² (eq. (29))."""
    A = sum(constants.G2[:deepest_cut])
    return 4.0 * constants.beta ** 2 * constants.gamma ** 2 * A


def rounds(constants, num_devices, interval, deepest_cut):
    """Real R of eq. (15) with equality, or ``inf`` when c − dI² ≤ 0."""
    margin = c_value(constants, num_devices) - d_value(constants, deepest_cut) * interval ** 2
    return 2.0 * constants.theta / (constants.gamma * margin) if margin > 0 else math.inf


def objective(profile, system, constants, interval, cuts):
    """Objective (28) in seconds: (2ϑ/γ)(I·T_split + T_agg)/(I(c − 4β²γ²I²A_{L_c})); ``inf`` if infeasible."""
    N = len(system.devices)
    margin = c_value(constants, N) - d_value(constants, max(cuts)) * interval ** 2
    if margin <= 0:
        return math.inf
    terms = stage_terms(profile, system, cuts)
    return (2.0 * constants.theta / constants.gamma) * (interval * terms["t_split"] + terms["t_agg"]) / (interval * margin)


def exact_total(profile, system, constants, interval, cuts):
    """Eq. (26) with R = ⌈R⌉ of eq. (15): (rounds, aggregations ⌊R/I⌋, total seconds)."""
    R = math.ceil(rounds(constants, len(system.devices), interval, max(cuts)))
    terms = stage_terms(profile, system, cuts)
    return R, R // interval, R * terms["t_split"] + (R // interval) * terms["t_agg"]


def max_interval(constants, num_devices, deepest_cut, cap=10_000):
    """Largest integer I with c − d I² > 0 (0 if none), by counting up (no closed form)."""
    c, d = c_value(constants, num_devices), d_value(constants, deepest_cut)
    I = 0
    while I < cap and c - d * (I + 1) ** 2 > 0:
        I += 1
    return I


def brute_force(profile, system, constants, candidates, intervals=None):
    """min over every cut vector in candidates^N and every feasible integer I (or the given ``intervals``)
    of objective (28): returns (objective seconds, I, cuts). Plain loops: small instances only."""
    N = len(system.devices)
    c, scale = c_value(constants, N), 2.0 * constants.theta / constants.gamma
    best = (math.inf, 0, ())
    for cuts in product(list(candidates), repeat=N):
        terms = stage_terms(profile, system, cuts)
        d = d_value(constants, max(cuts))
        top = max_interval(constants, N, max(cuts))
        for I in (intervals if intervals is not None else range(1, top + 1)):
            if c - d * I * I <= 0:
                continue
            value = scale * (I * terms["t_split"] + terms["t_agg"]) / (I * (c - d * I * I))  # (28)
            if value < best[0]:
                best = (value, I, tuple(cuts))
    return best
