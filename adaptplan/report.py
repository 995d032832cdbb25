"""Readable tables for plans (the default output of ``adaptplan plan``)."""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

import numpy as np

from adaptplan.latency import LatencyBreakdown, LatencyModel
from adaptplan.model_profile import ModelProfile
from adaptplan.plan import Plan
from adaptplan.system import SystemSpec


def _seconds(value: float) -> str:
    if value < 1:
        return f"{value:.4f} s"
    return f"{value:.2f} s" if value < 100 else f"{value:,.1f} s"


class Empty(str):
    """A table cell with no figure in it: it reads ``text`` (default ``-``) and keeps ``why`` it is empty (``target 30%
    not reached within 10 rounds``), which :func:`format_table` and :func:`empty_notes` write under the table, so that
    a table of dashes says what they mean. Compares and formats as its text."""

    why: str

    def __new__(cls, why: str, text: str = "-") -> "Empty":
        cell = super().__new__(cls, text)
        cell.why = why
        return cell


def empty_notes(headers: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "") -> list[str]:
    """One line per reason of the :class:`Empty` cells of ``rows`` (``headers``: their columns), in order of first
    appearance, naming the columns it empties: ``- (rounds→target, s→target): target 40% not reached within 10
    rounds``; none without an empty cell."""
    reasons: dict[str, list[str]] = {}
    for row in rows:
        for header, cell in zip(headers, row):
            if isinstance(cell, Empty):
                columns = reasons.setdefault(cell.why, [])
                if header not in columns:
                    columns.append(header)
    return [f"{indent}- ({', '.join(columns)}): {why}" for why, columns in reasons.items()]


def format_table(headers: list[str], rows: list[list[str]], *, numbers_right: bool = True) -> str:
    """Plain text table: a header, a rule and ``rows``, each column as wide as its widest cell; the first column
    left-aligned, the others right-aligned (numbers) unless ``numbers_right`` is false (text: all left-aligned); then,
    where a cell is :class:`Empty`, why (:func:`empty_notes`)."""
    widths = [max(len(h), *(len(r[k]) for r in rows)) if rows else len(h) for k, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if k and numbers_right else c.ljust(w)
                         for k, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in rows),
                      *empty_notes(headers, rows)])


AGGREGATION_STAGES = ("model upload", "model download")


def stage_totals(plan: Plan, breakdown: LatencyBreakdown) -> dict[str, float]:
    """Each stage's contribution to eq. (26) in seconds: split-stage terms × rounds,
    aggregation-stage terms × aggregations."""
    return {stage: seconds * (plan.aggregations if stage in AGGREGATION_STAGES else plan.rounds)
            for stage, seconds in breakdown.stages().items()}


def stage_rows(plan: Plan, breakdown: LatencyBreakdown) -> list[list[str]]:
    """Rows of the stage table; the stage with the largest total is marked as dominating."""
    totals = stage_totals(plan, breakdown)
    dominant = max(totals, key=totals.__getitem__)
    slowest = breakdown.slowest_devices()
    edge_terms = {"model upload": breakdown.edge_model_up, "model download": breakdown.edge_model_down}
    rows = []
    for stage, seconds in breakdown.stages().items():
        if stage in edge_terms and edge_terms[stage] >= seconds:
            who = "edge server"
        else:
            who = f"device {slowest[stage]}" if stage in slowest else "edge server"
        count = plan.aggregations if stage in AGGREGATION_STAGES else plan.rounds
        share = totals[stage] / plan.total_latency_s if plan.total_latency_s else 0.0
        rows.append([stage, _seconds(seconds), f"{count:,}", _seconds(totals[stage]), f"{100 * share:.1f}%",
                     who + ("  <- dominates" if stage == dominant else "")])
    return rows


DEVICE_ROWS = 20


def format_plan(plan: Plan, profile: ModelProfile, system: SystemSpec, title: str = "",
                max_devices: int | None = DEVICE_ROWS, rounds_to: str = "Corollary 1") -> str:
    """Summary, stage breakdown (which stage dominates) and per-device table of a plan; ``rounds_to`` says what its
    rounds reach (default Corollary 1's ε-stationary point; a calibrated plan's target accuracy).

    With more than ``max_devices`` devices only the slowest ones (largest per-round device time
    T^F + T^A + T^G + T^B) are listed; ``max_devices=None`` lists all.
    """
    breakdown = LatencyModel(profile, system).breakdown(plan.cuts)
    names = profile.names
    cut_counts = Counter(plan.cuts)
    lines = []
    if title:
        lines += [title, ""]
    lines += [
        f"model {profile.model}, {system.num_devices} devices, batch {system.batch_size}, L = {profile.num_cuts} cut points",
        f"interval I = {plan.interval} rounds; deepest cut L_c = {plan.deepest_cut} ({names[plan.deepest_cut - 1]})",
        "cuts used: " + ", ".join(f"{j} ({names[j - 1]}) x{n}" for j, n in sorted(cut_counts.items())),
        f"rounds R = {plan.rounds:,} ({rounds_to}), aggregations = {plan.aggregations:,}",
        f"per-round latency T_split = {_seconds(plan.round_latency_s)}, per-aggregation T_agg = {_seconds(plan.aggregation_latency_s)}",
        f"total latency (eq. 26) = {_seconds(plan.total_latency_s)}  (= {plan.total_latency_s / 3600:.2f} h); "
        f"relaxed objective (28) = {_seconds(plan.objective_s)}",
    ]
    if plan.lower_bound_s is not None:
        gap = plan.gap if plan.gap is not None else 0.0     # written together with the bound
        verdict = "proven optimal" if gap == 0 else f"at most {100 * gap:.3g}% above the optimum"
        lines.append(f"certificate: objective (28) >= {_seconds(plan.lower_bound_s)} for every plan; gap "
                     f"{100 * gap:.3g}% ({verdict})")
    if plan.solver:
        stats = ", ".join(f"{k} {v}" for k, v in plan.solver.items())
        lines.append(f"solver: {stats}")
    lines.append("")
    lines.append(format_table(["stage", "per occurrence", "occurrences", "total", "share", "set by"],
                              stage_rows(plan, breakdown)))
    lines.append("")
    device_rows = []
    shown = list(range(system.num_devices))
    if max_devices is not None and system.num_devices > max_devices:
        per_round = breakdown.client_fp + breakdown.upload + breakdown.download + breakdown.client_bp
        shown = sorted(int(i) for i in per_round.argsort()[::-1][:max_devices])
        lines.append(f"the {max_devices} slowest of {system.num_devices} devices (--all-devices lists every one):")
    bound = memory_bound(plan, profile, system)
    if bound is not None:
        lines.append(f"{int(bound.sum())} of {system.num_devices} devices are memory-bound (*: a cut between theirs "
                     f"and L_c = {plan.deepest_cut} does not fit their memory_bytes)")
    need = profile.client_memory
    for i in shown:
        device, cut = system.devices[i], plan.cuts[i]
        memory = [] if bound is None or need is None else [f"{need[cut - 1] / 2**20:.1f}/{(device.memory_bytes or 0) / 2**20:.1f}"
                                           + (" *" if bound[i] else "")]
        device_rows.append([
            str(i), f"{cut} {names[cut - 1]}", f"{device.flops / 1e12:.2f}", f"{device.up_bps / 1e6:.1f}",
            f"{device.down_bps / 1e6:.1f}",
            f"{1e3 * (breakdown.client_fp[i] + breakdown.upload[i]):.2f}",
            f"{1e3 * (breakdown.download[i] + breakdown.client_bp[i]):.2f}",
            f"{1e3 * breakdown.model_up[i]:.1f}", f"{1e3 * breakdown.model_down[i]:.1f}", *memory,
        ])
    lines.append(format_table(
        ["device", "cut", "TFLOP/s", "up Mbit/s", "down Mbit/s", "FP+up ms", "down+BP ms", "model up ms", "model down ms"]
        + ([] if bound is None else ["memory MiB used/budget"]), device_rows))
    return "\n".join(lines)


def memory_bound(plan: Plan, profile: ModelProfile, system: SystemSpec) -> np.ndarray | None:
    """Boolean per device: some cut j with ℓ_i < j ≤ L_c does not fit its ``memory_bytes`` (memory,
    not latency, may keep it shallower than the deepest device); ``None`` without memory budgets."""
    budgets, need = system.memory_budgets(), profile.client_memory
    if budgets is None or need is None:
        return None
    cuts = np.asarray(plan.cuts)
    j = np.arange(1, profile.num_cuts + 1)
    window = (j[None, :] > cuts[:, None]) & (j[None, :] <= plan.deepest_cut)
    return np.asarray((window & (need[None, :] > budgets[:, None])).any(axis=1))
