#!/usr/bin/env python3
"""Measure and date the README's figures instead of typing them (issue 37 item 6).

    python tools/readme_figures.py            # collect the suite, time the quick tier, rewrite README.md
    python tools/readme_figures.py --check    # only say whether README.md's counts are today's (exit 1 if not)

The figures sit in README.md between ``<!-- figures:quick-tier -->`` and ``<!-- /figures -->``: how many tests
the quick tier (``pytest -m "not slow"``) runs of how many in all, how long the quick tier took on this machine
(wall clock, its CPU count), and the date. The counts come from ``pytest --collect-only``; the time from running
the quick tier once. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- figures:quick-tier -->", "<!-- /figures -->"


def collected(*marker: str) -> int:
    """How many tests ``pytest --collect-only`` finds (with ``-m MARKER`` when given)."""
    args = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *marker]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found = re.search(r"(\d+)(?:/\d+)? tests? (?:collected|selected)", out)
    if found is not None:
        return int(found.group(1))
    per_file = re.findall(r"^\S+\.py: (\d+)$", out, flags=re.MULTILINE)    # -qq (the project's -q and ours)
    if not per_file:
        raise SystemExit(f"readme_figures: cannot read pytest's count from: {out.strip().splitlines()[-1:]}")
    return sum(int(n) for n in per_file)


def sentence(quick: int, total: int, seconds: float, cores: int, day: dt.date) -> str:
    """The README's figure sentence."""
    minutes, rest = divmod(round(seconds), 60)
    took = f"{minutes} min {rest} s" if minutes else f"{rest} s"
    return f"({quick:,} of {total:,} tests in {took} on {cores} cores, {day.isoformat()}; measured by tools/readme_figures.py)"


def rewrite(text: str, figures: str) -> str:
    """``text`` with the part between the markers replaced by ``figures`` (ValueError if the markers are missing)."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise ValueError(f"README.md must hold {START} ... {END} once")
    head, rest = text.split(START)
    _, tail = rest.split(END, 1)
    return f"{head}{START}{figures}{END}{tail}"


def counts_in(text: str) -> tuple[int, int]:
    """The (quick, total) counts written between the markers."""
    part = text.split(START)[1].split(END)[0]
    found = re.search(r"\(([\d,]+) of ([\d,]+) tests", part)
    if found is None:
        raise ValueError("no '(N of M tests' between the figure markers")
    return int(found.group(1).replace(",", "")), int(found.group(2).replace(",", ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare README.md's counts with the suite's; no run")
    args = parser.parse_args()
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    quick, total = collected("-m", "not slow"), collected()
    if args.check:
        written = counts_in(text)
        print(f"README: {written[0]} of {written[1]}; suite: {quick} of {total}")
        return 0 if written == (quick, total) else 1
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow"], cwd=ROOT,
                   check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    figures = sentence(quick, total, seconds, os.cpu_count() or 1, dt.date.today())
    readme.write_text(rewrite(text, figures), encoding="utf-8")
    print(f"README.md: {figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
