"""`adaptplan plot RUN... -o plot.png`: accuracy vs simulated time of several runs on one plot."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="plot test accuracy vs simulated seconds of several training runs",
                       description="Draw the runs' test accuracy against simulated time (seconds) on one PNG.")
    p.add_argument("runs", nargs="+", help="run folders (with history.json) or history.json files")
    p.add_argument("-o", "--output", default="plot.png",
                   help="output image (default plot.png); the extension picks the format (.png, .pdf, .svg, ...), "
                        ".png is appended to a name without one; a symbolic link is written through")
    p.add_argument("--title", help="plot title (default: what is drawn)")
    p.add_argument("--predicted-vs-measured", action="store_true",
                   help="for one torch.distributed run (train --distributed): mean seconds per stage predicted by the "
                        "latency model next to the measured ones, and every round's; prints the table too, with the plot's caveat "
                        "where the predictions are for placeholder resources (no --system)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainers.run.history import History
    from trainers.run.plotting import image_path, plot_histories, run_label

    image_path(args.output)   # a bad -o fails before any history is read
    if args.predicted_vs_measured:
        return _predicted_vs_measured(args)
    histories = []
    for run_path in args.runs:
        p = Path(run_path)
        history = History.load(_history_file(run_path))
        histories.append((run_label(p.name if p.is_dir() else p.parent.name, history), history))
    out = plot_histories(histories, args.output, args.title or "Test accuracy vs simulated time")
    print(out)   # the path written (with .png appended to a name without an extension)
    return 0


def _history_file(run_path: str) -> Path:
    from adaptplan.errors import InputError

    p = Path(run_path)
    file = p / "history.json" if p.is_dir() else p
    if not file.is_file():
        raise InputError(f"no history.json at {str(file)!r}", field="runs")
    return file


def _predicted_vs_measured(args: argparse.Namespace) -> int:
    from adaptplan.errors import InputError
    from trainers.run.history import History
    from trainers.run.plotting import plot_predicted_vs_measured, ratio_label, resources_note

    if len(args.runs) != 1:
        raise InputError(f"--predicted-vs-measured draws one run, got {len(args.runs)}", field="runs")
    history = History.load(_history_file(args.runs[0]))
    out = plot_predicted_vs_measured(history, args.output, args.title or "Predicted vs measured seconds per stage")
    print(f"{'stage':<16}{'predicted s':>14}{'measured s':>14}{'measured/pred.':>16}{'rounds':>8}")
    for row in history.stage_comparison():
        ratio = "-" if row["ratio"] is None else ratio_label(row["ratio"])
        print(f"{row['stage']:<16}{row['predicted_s']:>14.4g}{row['measured_s']:>14.4g}{ratio:>16}{row['rounds']:>8}")
    note = resources_note(history)
    if note:   # the caveat the plot carries, under the ratios it qualifies (stderr: stdout stays the table and path)
        print(f"note: the ratios are {note}", file=sys.stderr)
    print(out)
    return 0
