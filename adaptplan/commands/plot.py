"""`adaptplan plot RUN... -o plot.png`: accuracy vs simulated time of several runs on one plot."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="plot test accuracy vs simulated seconds of several training runs",
                       description="Draw the runs' test accuracy against simulated time (seconds) on one PNG.")
    p.add_argument("runs", nargs="+", help="run folders (with history.json) or history.json files")
    p.add_argument("-o", "--output", default="plot.png",
                   help="output image (default plot.png); the extension picks the format (.png, .pdf, .svg, ...), "
                        ".png is appended to a name without one; a symbolic link is written through")
    p.add_argument("--title", default="Test accuracy vs simulated time", help="plot title")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from adaptplan.errors import InputError
    from trainers.history import History
    from trainers.plotting import image_path, plot_histories

    image_path(args.output)   # a bad -o fails before any history is read
    histories = []
    for run_path in args.runs:
        p = Path(run_path)
        file = p / "history.json" if p.is_dir() else p
        if not file.is_file():
            raise InputError(f"no history.json at {str(file)!r}", field="runs")
        history = History.load(file)
        label = p.name if p.is_dir() else p.parent.name
        algorithm = history.meta.get("config", {}).get("algorithm")   # checked to be text by History.load
        histories.append((f"{label} ({algorithm})" if algorithm and algorithm != label else label, history))
    out = plot_histories(histories, args.output, args.title)
    print(out)   # the path written (with .png appended to a name without an extension)
    return 0
