"""Plots that show their data (issue 37 item 5; trainers/run/plotting.py): every run visible even where curves
coincide, each labelled by its policy, algorithm and model, and a predicted-vs-measured plot that says when its
predictions rest on placeholder resources — checked on the figure and by opening the image written."""

from __future__ import annotations

import numpy as np

from trainers.run.history import History, RoundRecord


def history(accuracies, config, measured: bool = False) -> History:
    records = [RoundRecord(t, 1.0, a, 0.5, 0.1 * t, 0.1, 0.2 * t, 10, 10, 0, True, False, [2, 2], 1,
                           stage_seconds={"server": 0.05, "uplink": 0.05},
                           measured_stage_seconds={"server": 0.5, "uplink": 0.2} if measured else {},
                           measured_round_seconds=0.7 if measured else None)
               for t, a in enumerate(accuracies, start=1)]
    return History(records=records, meta={"config": config})


def test_coinciding_runs_each_keep_a_marker_and_style_and_say_what_they_trained(tmp_path) -> None:
    """Six runs, four of them on the same flat curve (as `plot runs/*` of short runs draws them): six distinct
    (marker, line style) pairs; labels name the policy where one decided, the algorithm and the model."""
    import matplotlib.pyplot as plt

    from trainers.run.plotting import accuracy_figure, plot_histories, run_label

    flat = [0.108] * 3
    runs = [("run", history(flat, {"algorithm": "adaptsfl", "model": "cnn"})),
            ("rma+rms", history(flat, {"algorithm": "adaptsfl", "model": "cnn", "policy": "rma+rms"})),
            ("squeezenet", history(flat, {"algorithm": "adaptsfl", "model": "squeezenet1_1"})),
            ("v1", history(flat, {"algorithm": "sfl-v1", "model": "cnn"})),
            ("scala", history([0.2, 0.3, 0.4], {"algorithm": "scala", "model": "cnn"})),
            ("one point", history([0.5], {"algorithm": "psl", "model": "mlp"}))]
    labelled = [(run_label(name, h), h) for name, h in runs]
    assert [label for label, _ in labelled][:3] == ["run: adaptsfl, cnn", "rma+rms: policy rma+rms, adaptsfl, cnn",
                                                    "squeezenet: adaptsfl, squeezenet1_1"]
    fig = accuracy_figure(labelled, "t")
    try:
        lines = fig.axes[0].get_lines()
        assert [line.get_label() for line in lines] == [label for label, _ in labelled]
        styles = {(line.get_marker(), str(line.get_linestyle()), line.get_color()) for line in lines}
        assert len(styles) == 6 and all(line.get_marker() not in ("", "None", None) for line in lines)
        assert len(lines[-1].get_xdata()) == 1                               # one point still drawn: a marker
    finally:
        plt.close(fig)
    written = plot_histories(labelled, tmp_path / "accuracy.png")
    image = plt.imread(written)                                          # opened: a picture, not a blank page
    assert image.shape[0] > 300 and image.shape[1] > 500 and float(np.std(image[..., :3])) > 0.05


def test_predicted_vs_measured_says_when_the_resources_are_placeholders(tmp_path, monkeypatch) -> None:
    import matplotlib.figure

    from trainers.run.plotting import plot_predicted_vs_measured

    texts: list[str] = []
    save = matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kwargs):
        texts.extend(t.get_text() for t in fig.texts)
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    plot_predicted_vs_measured(history([0.1, 0.2], {"algorithm": "psl", "system_path": None}, measured=True),
                               tmp_path / "generated.png", "t")
    assert any("placeholder resources" in t for t in texts)
    texts.clear()
    plot_predicted_vs_measured(history([0.1, 0.2], {"algorithm": "psl", "system_path": "sys.json"}, measured=True),
                               tmp_path / "measured.png", "t")
    assert not any("placeholder" in t for t in texts)
