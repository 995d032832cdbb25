"""The per-round latency model, docs/model.md §2.2–§2.4, eqs. (16)–(26).

This is the only implementation of the world model's latency: the solvers, the benchmarks and
the trainers' simulated clock all call it. Cuts are 1-based cut indices ℓ_i (as in the profile);
all times are **seconds**.

:class:`LatencyModel` precomputes, for every device i and cut j, the coefficient matrices the
MILP of eq. (34) needs (they are the rows of docs/model.md §5.1), so evaluating a cut vector is a gather.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from adaptplan.model_profile import ModelProfile
from adaptplan.plan import check_cut_vector
from adaptplan.system import SystemSpec


def split_latency(fp_upload: np.ndarray, server: float | np.ndarray, download_bp: np.ndarray) -> np.ndarray:
    """§2.4: T_split = max_i{T_i^F + T_i^A} + (T_s^F + T_s^B) + max_i{T_i^G + T_i^B}, seconds per round;
    the devices on the last axis of ``fp_upload`` and ``download_bp`` (one row per cut vector)."""
    return np.max(fp_upload, axis=-1) + server + np.max(download_bp, axis=-1)


def aggregation_latency(model_up: np.ndarray, edge_up: float | np.ndarray, model_down: np.ndarray,
                        edge_down: float | np.ndarray) -> np.ndarray:
    """§2.4: T_agg = max{max_i T_i^{mU}, T_e^{mU}} + max{max_i T_i^{mD}, T_e^{mD}}, seconds per aggregation."""
    return np.maximum(np.max(model_up, axis=-1), edge_up) + np.maximum(np.max(model_down, axis=-1), edge_down)


def non_common_bits(delta: np.ndarray, cuts: np.ndarray, deepest: np.ndarray) -> np.ndarray:
    """S_n = Σ_i (δ_{L_c} − δ_{ℓ_i}) in bits (§2.3 / A5): the server-side part the edge server sends the
    fed server for devices cut above L_c; ``cuts`` 0-based (K, N), ``deepest`` 0-based (K,)."""
    return (delta[deepest][:, None] - delta[cuts]).sum(axis=1)


@dataclass(frozen=True)
class LatencyBreakdown:
    """Every term of eqs. (16)–(25) for one cut vector, in seconds.

    Per-device arrays have shape (N,). ``t_split`` and ``t_agg`` are the two stage latencies of
    §2.4; ``dominant_stage`` names the largest of the six stage terms.
    """

    client_fp: np.ndarray        # (16) T_i^F
    upload: np.ndarray           # (17) T_i^A
    server_fp: float             # (18) T_s^F
    server_bp: float             # (19) T_s^B
    download: np.ndarray         # (20) T_i^G
    client_bp: np.ndarray        # (21) T_i^B
    model_up: np.ndarray         # (22) T_i^{mU}
    edge_model_up: float         # (23) T_e^{mU}
    model_down: np.ndarray       # (24) T_i^{mD}
    edge_model_down: float       # (25) T_e^{mD}

    @property
    def fp_upload_max(self) -> float:
        """max_i {T_i^F + T_i^A}."""
        return float(np.max(self.client_fp + self.upload))

    @property
    def download_bp_max(self) -> float:
        """max_i {T_i^G + T_i^B}."""
        return float(np.max(self.download + self.client_bp))

    @property
    def agg_up_max(self) -> float:
        """max{ max_i T_i^{mU}, T_e^{mU} }."""
        return float(max(np.max(self.model_up), self.edge_model_up))

    @property
    def agg_down_max(self) -> float:
        """max{ max_i T_i^{mD}, T_e^{mD} }."""
        return float(max(np.max(self.model_down), self.edge_model_down))

    @property
    def t_split(self) -> float:
        """T_split of §2.4 (:func:`split_latency`), seconds per round."""
        return float(split_latency(self.client_fp + self.upload, self.server_fp + self.server_bp,
                                   self.download + self.client_bp))

    @property
    def t_agg(self) -> float:
        """T_agg of §2.4 (:func:`aggregation_latency`), seconds per aggregation."""
        return float(aggregation_latency(self.model_up, self.edge_model_up, self.model_down, self.edge_model_down))

    def stages(self) -> dict[str, float]:
        """The six stage terms of T_split and T_agg, in seconds."""
        return {
            "client FP + upload": self.fp_upload_max,
            "server FP": self.server_fp,
            "server BP": self.server_bp,
            "download + client BP": self.download_bp_max,
            "model upload": self.agg_up_max,
            "model download": self.agg_down_max,
        }

    @property
    def dominant_stage(self) -> str:
        stages = self.stages()
        return max(stages, key=stages.__getitem__)

    def slowest_devices(self) -> dict[str, int]:
        """0-based index of the device that sets each per-device max."""
        return {
            "client FP + upload": int(np.argmax(self.client_fp + self.upload)),
            "download + client BP": int(np.argmax(self.download + self.client_bp)),
            "model upload": int(np.argmax(self.model_up)),
            "model download": int(np.argmax(self.model_down)),
        }


class LatencyModel:
    """Eqs. (16)–(26) for one (profile, system) pair.

    Coefficient matrices, shape (N, L), entry [i, j−1] for device i and cut j (seconds):

    * ``fp_up``    = b(ρ_j/f_i + ψ_j/r_i^U)          — (16)+(17), the μ₁ row of §5.1
    * ``down_bp``  = b(χ_j/r_i^D + ϖ_j/f_i)          — (20)+(21), the μ₂ row
    * ``model_up`` = δ_j / r_i^{fU}                  — (22), the μ₃ row
    * ``model_down`` = δ_j / r_i^{fD}                — (24), the μ₄ row

    and per-cut vectors, shape (L,): ``server_fp_per_device`` = b(ρ_L − ρ_j)/f_s (18),
    ``server_bp_per_device`` = b(ϖ_L − ϖ_j)/f_s (19) (or the profile's ``server_bp_flops``) and
    their sum ``server_per_device``, one device's share of the server stage.
    """

    def __init__(self, profile: ModelProfile, system: SystemSpec) -> None:
        self.profile, self.system = profile, system
        b = float(system.batch_size)
        f = system.device_array("flops")[:, None]
        rho, varpi, psi, chi, delta = profile.rho, profile.varpi, profile.psi, profile.chi, profile.delta
        self.client_fp = b * (rho + profile.defence_fp)[None, :] / f                    # (16), with a defence's ο^F_j
        self.upload = b * psi[None, :] / system.device_array("up_bps")[:, None]         # (17)
        self.download = b * chi[None, :] / system.device_array("down_bps")[:, None]     # (20)
        self.client_bp = b * (varpi + profile.defence_bp)[None, :] / f                  # (21), with a defence's ο^B_j
        self.fp_up = self.client_fp + self.upload
        self.down_bp = self.download + self.client_bp
        self.model_up = delta[None, :] / system.device_array("fed_up_bps")[:, None]
        self.model_down = delta[None, :] / system.device_array("fed_down_bps")[:, None]
        self.server_fp_per_device = b * (rho[-1] - rho) / system.server_flops
        self.server_bp_per_device = b * profile.server_bp / system.server_flops
        self.delta = delta

    @property
    def server_per_device(self) -> np.ndarray:
        """(18)+(19) per device for each cut j, shape (L,), seconds: one device's share of the server stage."""
        return self.server_fp_per_device + self.server_bp_per_device

    @property
    def num_devices(self) -> int:
        return self.system.num_devices

    @property
    def num_cuts(self) -> int:
        return self.profile.num_cuts

    def check_cuts(self, cuts: Sequence[int]) -> np.ndarray:
        """Return ``cuts`` as a 0-based int array of shape (N,), or raise naming the bad entry."""
        return check_cut_vector(cuts, self.num_devices, self.num_cuts) - 1

    def breakdown(self, cuts: Sequence[int]) -> LatencyBreakdown:
        """Every term of eqs. (16)–(25) for the 1-based cut vector ``cuts``."""
        j = self.check_cuts(cuts)
        rows = np.arange(self.num_devices)
        s_n = float(non_common_bits(self.delta, j[None, :], np.array([j.max()]))[0])
        return LatencyBreakdown(
            client_fp=self.client_fp[rows, j],
            upload=self.upload[rows, j],
            server_fp=float(np.sum(self.server_fp_per_device[j])),
            server_bp=float(np.sum(self.server_bp_per_device[j])),
            download=self.download[rows, j],
            client_bp=self.client_bp[rows, j],
            model_up=self.model_up[rows, j],
            edge_model_up=s_n / self.system.edge_to_fed_bps,
            model_down=self.model_down[rows, j],
            edge_model_down=s_n / self.system.fed_to_edge_bps,
        )

    def stage_latencies(self, cut_matrix: np.ndarray, deepest: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(T_split, T_agg) of §2.4 in seconds for K cut vectors at once.

        Args:
            cut_matrix: (K, N) 1-based cuts (one cut vector per row; not validated — see ``t_split``).
            deepest: if given, S_n = Σ_i (δ_deepest − δ_{ℓ_i}) uses this 1-based cut instead of each
                row's own L_c = max_i ℓ_i — the payload when the deepest cut is fixed as an upper
                bound (μ₆ of §4.3), as the exact solvers do.

        Returns:
            two arrays of shape (K,).
        """
        j = np.asarray(cut_matrix, dtype=int) - 1
        rows = np.arange(self.num_devices)[None, :]
        t_split = split_latency(self.fp_up[rows, j], self.server_per_device[j].sum(axis=1), self.down_bp[rows, j])
        top = j.max(axis=1) if deepest is None else np.full(j.shape[0], deepest - 1)
        s_n = non_common_bits(self.delta, j, top)
        t_agg = aggregation_latency(self.model_up[rows, j], s_n / self.system.edge_to_fed_bps,
                                    self.model_down[rows, j], s_n / self.system.fed_to_edge_bps)
        return t_split, t_agg

    def t_split(self, cuts: Sequence[int]) -> float:
        """T_split(x) of §2.4 in seconds for one (validated) cut vector."""
        return float(self.stage_latencies(self.check_cuts(cuts)[None, :] + 1)[0][0])

    def t_agg(self, cuts: Sequence[int]) -> float:
        """T_agg(x) of §2.4 in seconds for one (validated) cut vector."""
        return float(self.stage_latencies(self.check_cuts(cuts)[None, :] + 1)[1][0])


def total_latency(rounds: int, interval: int, t_split: float, t_agg: float) -> float:
    """Eq. (26): T(R, I, x) = R·T_split + ⌊R/I⌋·T_agg, seconds (R integer rounds)."""
    return rounds * t_split + (rounds // interval) * t_agg
