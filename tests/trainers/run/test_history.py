"""trainers.run.history: the summary's figures, the final accuracy, the convergence floor and the CSV columns,
each checked against values written out by hand."""

from __future__ import annotations

import csv
import json

import pytest

from adaptplan.errors import InputError
from trainers.run.history import History, RoundRecord, history_text


def record(t: int, accuracy: float | None, sim: float, **kw) -> RoundRecord:
    return RoundRecord(t, 2.0 / t, accuracy, None if accuracy is None else 1.0 / t, sim, 1.5, 0.25 * t, 100 * t, 50 * t,
                       7, t % 2 == 0, False, [1, 3], 2, **kw)


def test_empty_history_summary() -> None:
    assert History().summary() == {"rounds": 0, "final_accuracy": None, "converged_round": None, "sim_seconds": 0.0,
                                   "wall_seconds": 0.0}
    assert History().summary(0.5) == {"rounds": 0, "final_accuracy": None, "converged_round": None, "sim_seconds": 0.0,
                                      "wall_seconds": 0.0, "target_accuracy": 0.5, "time_to_target_s": None,
                                      "to_target": {"rounds": None, "seconds": None, "upper_bound": False}}


def test_summary_of_a_converged_run() -> None:
    # evaluations every round: gains 0.2, 0.2, then 0.0, 0.01, 0.0, 0.01, 0.0 — the fifth small gain is at round 8
    accs = [0.3, 0.5, 0.7, 0.7, 0.71, 0.71, 0.72, 0.72]
    h = History([record(t, a, 10.0 * t) for t, a in enumerate(accs, start=1)])
    assert h.summary(0.7) == {"rounds": 8, "final_accuracy": 0.72, "converged_round": 8, "sim_seconds": 80.0,
                              "wall_seconds": 2.0, "converged_accuracy": 0.72, "converged_sim_seconds": 80.0,
                              "target_accuracy": 0.7, "time_to_target_s": 30.0,
                              "to_target": {"rounds": 3.0, "seconds": 30.0, "upper_bound": False}}


def test_time_to_target_is_interpolated_and_set_beside_a_calibrated_prediction() -> None:
    # evaluations at rounds 5, 10, 15 (0.2, 0.5, 0.7) at 2 simulated s per round; target 0.6 is half-way from the
    # evaluation at round 10 (20 s) to the one at round 15 (30 s): 12.5 rounds, 25 s
    h = History([record(t, {5: 0.2, 10: 0.5, 15: 0.7}.get(t), 2.0 * t) for t in range(1, 16)])
    assert h.to_target(0.6) == {"rounds": 12.5, "seconds": 25.0, "upper_bound": False}
    assert h.to_target(0.1) == {"rounds": 5.0, "seconds": 10.0, "upper_bound": True}    # at the first evaluation
    assert h.to_target(0.8) == {"rounds": None, "seconds": None, "upper_bound": False}
    h.events.append({"round": 0, "event": "plan", "plan": {"rounds": 10, "total_latency_s": 20.0}})
    assert "predicted_rounds" not in h.to_target(0.6)                 # no calibration: nothing predicted to 0.6
    h.meta["calibration"] = {"target_accuracy": 0.6}
    assert h.to_target(0.6) == {"rounds": 12.5, "seconds": 25.0, "upper_bound": False, "predicted_rounds": 10,
                                "predicted_seconds": 20.0, "measured_over_predicted": 1.25}
    assert "predicted_rounds" not in h.to_target(0.5)                 # calibrated for another target
    h.meta["calibration"] = {"target_accuracy": 0.8}
    assert h.to_target(0.8)["measured_over_predicted"] is None         # never reached: nothing to compare


def test_final_accuracy_prefers_the_final_evaluation() -> None:
    h = History([record(1, 0.4, 1.0), record(2, None, 2.0)])
    assert h.final_accuracy == 0.4                       # the last evaluated round
    h.meta["final_evaluation"] = {"round": 2, "accuracy": 0.55, "test_loss": 1.0, "sim_seconds": 2.0}
    assert h.final_accuracy == 0.55 and h.summary()["final_accuracy"] == 0.55


def test_convergence_floor_from_the_number_of_classes() -> None:
    # a streak of tiny gains at 30 % accuracy: converged unless the floor (2/M) is above 0.3
    accs = [0.3, 0.3, 0.3, 0.3, 0.3, 0.3]
    records = [record(t, a, float(t)) for t, a in enumerate(accs, start=1)]
    assert History(records, meta={"num_classes": 10}).converged_round() == 6        # floor 0.2
    assert History(records, meta={"num_classes": 4}).converged_round() is None      # floor 0.5
    for classes in (0, -3, "ten", None):                  # unknown or meaningless: no floor
        assert History(records, meta={"num_classes": classes}).converged_round() == 6
    # an evaluation below the floor ends the streak: it restarts at 0.205 (round 3), its fifth small gain is round 7
    dip = [0.5, 0.195, 0.205, 0.21, 0.215, 0.22, 0.225]
    assert History([record(t, a, float(t)) for t, a in enumerate(dip, start=1)],
                   meta={"num_classes": 10}).converged_round() == 7


def test_csv_has_one_row_per_record_with_lists_and_objects_spelled_out(tmp_path) -> None:
    h = History([record(1, None, 1.5, participants=[0, 2], stage_seconds={"uplink": 0.5, "device FP": 1.0},
                        metrics={"selected": 0.5}),
                 record(2, 0.25, 3.0)])
    h.save(tmp_path)
    with open(tmp_path / "history.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["round", "train_loss", "accuracy", "test_loss", "sim_seconds", "round_sim_seconds",
                       "wall_seconds", "bytes_up", "bytes_down", "bytes_server", "aggregated", "replanned", "cuts",
                       "interval", "participants", "stage_seconds", "metrics", "measured_stage_seconds",
                       "measured_round_seconds", "local_accuracy", "local_sampled_accuracy"]
    assert rows[1] == ["1", "2.0", "", "", "1.5", "1.5", "0.25", "100", "50", "7", "False", "False", "1 3", "2", "0 2",
                       '{"device FP": 1.0, "uplink": 0.5}', '{"selected": 0.5}', "{}", "", "", ""]
    assert rows[2] == ["2", "1.0", "0.25", "0.5", "3.0", "1.5", "0.5", "200", "100", "7", "True", "False", "1 3", "2", "",
                       "{}", "{}", "{}", "", "", ""]
    assert len(rows) == 3
    assert History.load(tmp_path).records == h.records


def test_history_json_is_indented_with_one_line_per_round(tmp_path) -> None:
    from dataclasses import asdict

    h = History([record(1, None, 1.5, participants=[0, 2], stage_seconds={"uplink": 0.5}, metrics={"ratio": 0.25}),
                 record(2, 0.25, 3.0, local_accuracy=0.5)], meta={"num_classes": 10, "final_evaluation": None},
                events=[{"round": 1, "event": "plan"}])
    assert [r.to_json() for r in h.records] == [asdict(r) for r in h.records]          # the dataclasses reference
    copied = h.records[0].to_json()
    copied["participants"].append(9), copied["stage_seconds"].update(uplink=9.0)
    assert h.records[0].participants == [0, 2] and h.records[0].stage_seconds == {"uplink": 0.5}   # copies, not views
    h.save(tmp_path)
    text = (tmp_path / "history.json").read_text(encoding="utf-8")
    assert json.loads(text) == json.loads(json.dumps(h.to_json(), indent=2))         # the same JSON as before
    lines = text.splitlines()
    start = lines.index('  "records": [')
    head = json.dumps({k: v for k, v in h.to_json().items() if k != "records"}, indent=2)
    assert "\n".join(lines[:start]) == head[:-2] + ","                                 # meta, events, summary indented
    assert [json.loads(line.strip().rstrip(",")) for line in lines[start + 1:-2]] == [asdict(r) for r in h.records]
    assert all(line.startswith("    {") for line in lines[start + 1:-2])              # one round per line, indented
    assert lines[-2:] == ["  ]", "}"] and text.endswith("}\n")
    assert History.load(tmp_path).records == h.records
    assert json.loads(history_text({"records": [{"round": 1}]})) == {"records": [{"round": 1}]}   # nothing before it
    History([]).save(tmp_path)
    assert (tmp_path / "history.json").read_text(encoding="utf-8").endswith('  "records": []\n}\n')


def test_summary_must_be_an_object() -> None:
    doc = History([record(1, 0.5, 1.0)]).to_json()
    History.from_json(doc)
    with pytest.raises(InputError) as info:
        History.from_json({**doc, "summary": [1, 2]})
    assert info.value.field == "history.summary"
    assert json.loads(json.dumps(doc))["summary"]["rounds"] == 1


def test_plot_draws_accuracy_against_simulated_seconds(tmp_path, monkeypatch) -> None:
    import matplotlib.pyplot as plt

    from trainers.run.plotting import plot_histories

    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig) or close(fig))
    a = History([record(1, None, 1.5), record(2, 0.25, 3.0), record(3, None, 4.0), record(4, 0.5, 6.5)])
    b = History([record(1, 0.125, 2.0, local_accuracy=0.75)])
    path = plot_histories([("first", a), ("second", b)], tmp_path / "curves", title="cost $5")
    assert path == tmp_path / "curves.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (ax,) = figures[0].axes
    lines = [(line.get_label(), list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()]
    assert lines == [("first", [3.0, 6.5], [0.25, 0.5]), ("second (global test set)", [2.0], [0.125]),
                     ("second (local held-out samples)", [2.0], [0.75])]                # evaluated rounds only
    second, local = ax.get_lines()[1:]
    assert local.get_linestyle() == "--" and local.get_color() == second.get_color()
    assert ax.get_xlabel() == "simulated time (s)" and ax.get_ylabel() == "accuracy"
    assert ax.get_title() == r"cost \$5"                                                # literal, not mathtext
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["first", "second (global test set)",
                                                                   "second (local held-out samples)"]


def test_record_lists_hold_at_most_one_entry_per_device() -> None:
    # README input limits: at most 10,000 devices, so at most 10,000 cuts/participants in a record
    doc = History([record(1, 0.5, 1.0)]).to_json()
    row = doc["records"][0]
    History.from_json({**doc, "records": [{**row, "cuts": [1] * 10_000, "participants": list(range(10_000))}]})
    for name, value in (("cuts", [1] * 10_001), ("participants", list(range(10_000)) + [0]), ("participants", [10_000]),
                        ("participants", [-1])):
        with pytest.raises(InputError) as info:
            History.from_json({**doc, "records": [{**row, name: value}]})
        assert info.value.field.startswith(f"history.records[0].{name}")     # the list, or its bad entry


def test_losses_may_be_integers_or_non_finite_in_a_file() -> None:
    doc = History([record(1, 0.5, 1.0)]).to_json()
    row = doc["records"][0]
    loaded = History.from_json({**doc, "records": [{**row, "train_loss": 2, "test_loss": float("nan")}]})
    assert loaded.records[0].train_loss == 2.0 and isinstance(loaded.records[0].train_loss, float)
    assert loaded.records[0].test_loss != loaded.records[0].test_loss              # NaN kept (a diverged run)
    with pytest.raises(InputError) as info:
        History.from_json({**doc, "records": [{**row, "train_loss": "low"}]})
    assert info.value.field == "history.records[0].train_loss"


def test_the_predicted_vs_measured_ratios_read_as_plain_numbers() -> None:
    """Issue 25 item 8: ratios were printed as 1.3e+02×."""
    from trainers.run.plotting import ratio_label

    assert [ratio_label(r) for r in (0.853, 1.3, 130.4, 2400.0, 0.004)] == ["0.85×", "1.3×", "130×", "2,400×", "4.0e-03×"]
