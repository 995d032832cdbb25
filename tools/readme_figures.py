#!/usr/bin/env python3
"""Measure and date the README's figures instead of typing them (issue 37 item 6).

    python tools/readme_figures.py            # collect the suite, time the quick tier, rewrite README.md
    python tools/readme_figures.py --check    # only say whether README.md's counts are today's (exit 1 if not)

The figures sit in README.md between ``<!-- figures:quick-tier -->`` and ``<!-- /figures -->``: how many tests
the quick tier (``pytest -m "not slow"``) runs of how many in all, how long the quick tier took on this machine
(wall clock, its CPU count), and the date. The counts come from ``pytest --collect-only``; the time from running
the quick tier once. Run it on an idle machine, with the README's environment's Python (``.venv/bin/python``).

docs/usage.md's set-up notes hold the environment's size between ``<!-- figures:environment -->`` and the same end
marker: the virtual environment this script runs in (``sys.prefix``), and how much of it is the CUDA libraries that
PyPI's torch for Linux brings (``nvidia*``, ``cuda*`` and ``triton`` in site-packages), unused on a CPU-only machine.
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
ENVIRONMENT = "<!-- figures:environment -->"
CUDA_PACKAGES = ("nvidia*", "cuda*", "triton")


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


def rewrite(text: str, figures: str, start: str = START) -> str:
    """``text`` with the part between ``start`` and the end marker after it replaced by ``figures`` (ValueError if
    ``start`` is not there once with an end marker after it)."""
    if text.count(start) != 1 or END not in text.split(start, 1)[1]:
        raise ValueError(f"the text must hold {start} ... {END} once")
    head, rest = text.split(start)
    _, tail = rest.split(END, 1)
    return f"{head}{start}{figures}{END}{tail}"


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (``path`` itself where it is a file), links not followed."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def environment_sentence(total: int, cuda: int, day: dt.date) -> str:
    """docs/usage.md's figure: the environment's size and its CUDA part, in GB (10⁹ bytes)."""
    return (f"{total / 1e9:.1f} GB, {cuda / 1e9:.1f} GB of it CUDA libraries, {day.isoformat()}; measured by "
            "tools/readme_figures.py")


def environment_sizes(prefix: Path) -> tuple[int, int]:
    """(bytes of the environment at ``prefix``, bytes of its CUDA packages :data:`CUDA_PACKAGES`)."""
    cuda = sum(tree_bytes(p) for site in prefix.glob("lib/python*/site-packages") for pattern in CUDA_PACKAGES
               for p in site.glob(pattern) if not p.name.endswith((".dist-info", ".pth")))
    return tree_bytes(prefix), cuda


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
    usage = ROOT / "docs" / "usage.md"
    size = environment_sentence(*environment_sizes(Path(sys.prefix)), dt.date.today())
    usage.write_text(rewrite(usage.read_text(encoding="utf-8"), size, ENVIRONMENT), encoding="utf-8")
    print(f"docs/usage.md: {size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
