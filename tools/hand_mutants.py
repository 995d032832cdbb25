"""Hand-written mutants: realistic bugs, each one edit of the code, run against the tests that should catch it.

``tools/mutate.py`` plants operator mutants at random; the bugs a review finds are often of other shapes — a
bound moved by one, a documented name spelled anew, a figure computed from the code's own table, a case no test
builds, a shape taken as square. ``tools/hand_mutants/*.toml`` holds such bugs, one ``[[mutant]]`` table each:

``id``      a short unique name
``class``   one of :data:`CLASSES` (what kind of test would catch it)
``path``    the file, relative to the repository root
``find``    text that occurs exactly once in that file
``replace`` what it becomes (the bug)
``tests``   pytest arguments that should kill it (e.g. "tests/trainers/test_api.py -k sample")
``why``     one line: what the bug does and why a user would care
``equivalent`` (optional) the reason the edit cannot change behaviour; such a mutant is listed, not scored

Every mutant runs on a temporary copy of the repository (the tree is never edited), one at a time, after the
unmutated code has passed its tests; only a failing test (pytest's exit code 1) or a time-out kills a mutant, never
a test file that does not run. ``--check`` only verifies that every ``find`` occurs exactly once and every test path
exists (the project's tests run it, so a mutant cannot go stale silently).

    .venv/bin/python tools/hand_mutants.py                 # every mutant, a table per class at the end
    .venv/bin/python tools/hand_mutants.py --only ID,ID    # some
    .venv/bin/python tools/hand_mutants.py --check         # the file's finds still match the code
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import signal
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutate import IGNORE, run_pytest  # noqa: E402

CLASSES = {
    "edge": "a documented limit tested at its edge (just inside, just outside)",
    "documented": "a documented name, key, tag or format pinned literally, not against the code's own table",
    "recomputed": "a reported figure recomputed independently (accuracies, bytes, seconds)",
    "degenerate": "a degenerate case built (an empty part, an absent field, nothing held out)",
    "shape": "an input of another shape than the square one (non-square images, odd sizes)",
}
FOLDER = Path(__file__).resolve().parent / "hand_mutants"


@dataclass(frozen=True)
class HandMutant:
    id: str
    kind: str
    path: str
    find: str
    replace: str
    tests: str
    why: str
    equivalent: str = ""


def load(folder: Path = FOLDER) -> list[HandMutant]:
    """Every mutant of the folder's TOML files, in file and table order (ValueError on a malformed one)."""
    mutants: list[HandMutant] = []
    for path in sorted(folder.glob("*.toml")):
        for table in tomllib.loads(path.read_text(encoding="utf-8")).get("mutant", []):
            missing = {"id", "class", "path", "find", "replace", "tests", "why"} - set(table)
            if missing:
                raise ValueError(f"{path.name}: mutant {table.get('id', '?')} lacks {sorted(missing)}")
            if table["class"] not in CLASSES:
                raise ValueError(f"{path.name}: mutant {table['id']}: class {table['class']!r} is not one of "
                                 f"{', '.join(CLASSES)}")
            mutants.append(HandMutant(table["id"], table["class"], table["path"], table["find"], table["replace"],
                                      table["tests"], table["why"], table.get("equivalent", "")))
    ids = [m.id for m in mutants]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ValueError(f"mutant ids used twice: {twice}")
    return mutants


def problems(root: Path, mutants: list[HandMutant]) -> list[str]:
    """Why a mutant cannot be applied: its file is missing, its ``find`` occurs other than once, or it changes
    nothing."""
    found = []
    for m in mutants:
        file = root / m.path
        if not file.is_file():
            found.append(f"{m.id}: no file {m.path}")
            continue
        count = file.read_text(encoding="utf-8").count(m.find)
        if count != 1:
            found.append(f"{m.id}: its find occurs {count} times in {m.path}")
        if m.find == m.replace:
            found.append(f"{m.id}: replace equals find")
        for arg in shlex.split(m.tests):
            path = arg.split("::")[0]
            if path.startswith("tests") and not (root / path).exists():
                found.append(f"{m.id}: no test path {path}")
    return found


def run_tests(copy_root: Path, python: str, test_args: list[str], timeout: float) -> tuple[str, float]:
    """pytest on ``copy_root``: "fail" only where a test failed (exit code 1), "pass", "timeout" (counted as
    killed), or "error" (collection errors, no tests: the mutant's tests say nothing, so it counts as not killed)."""
    code, seconds = run_pytest(copy_root, python, test_args, timeout)
    return ("timeout" if code is None else {0: "pass", 1: "fail"}.get(code, "error")), seconds


def run(root: Path, mutants: list[HandMutant], python: str, timeout: float) -> list[tuple[HandMutant, str, float]]:
    """Each mutant applied alone to a copy of ``root`` and its tests run: (mutant, "fail" | "pass" | "timeout" |
    "error", seconds). The unmutated code must pass each mutant's tests first (once per distinct test set): a mutant
    whose tests fail without it is reported "error", not killed."""
    results = []
    with tempfile.TemporaryDirectory(prefix="hand-mutants-") as tmp:
        copy_root = Path(tmp) / "repo"
        shutil.copytree(root, copy_root, ignore=IGNORE)
        baseline: dict[str, str] = {}
        for n, m in enumerate(mutants, start=1):
            if m.tests not in baseline:
                baseline[m.tests] = run_tests(copy_root, python, shlex.split(m.tests), 3600)[0]
                if baseline[m.tests] != "pass":
                    print(f"  the unmutated code does not pass: {m.tests} ({baseline[m.tests]})", flush=True)
            if baseline[m.tests] != "pass":
                results.append((m, "error", 0.0))
                continue
            target = copy_root / m.path
            original = target.read_text(encoding="utf-8")
            try:
                target.write_text(original.replace(m.find, m.replace, 1), encoding="utf-8")
                outcome, seconds = run_tests(copy_root, python, shlex.split(m.tests), timeout)
            finally:
                target.write_text(original, encoding="utf-8")
            results.append((m, outcome, seconds))
            status = {"fail": "killed", "timeout": "killed (timeout)", "pass": "SURVIVED", "error": "ERROR"}[outcome]
            note = "  [equivalent]" if m.equivalent else ""
            print(f"[{n}/{len(mutants)}] {status:16s} {seconds:6.1f}s  {m.kind:10s} {m.id}{note}", flush=True)
    return results


def score(results: list[tuple[HandMutant, str, float]]) -> str:
    """Killed / non-equivalent mutants per class and in all, then the survivors and the equivalents."""
    lines = ["per class (killed / non-equivalent):"]
    scored = [(m, o) for m, o, _ in results if not m.equivalent]
    for kind in CLASSES:
        of_kind = [o for m, o in scored if m.kind == kind]
        if of_kind:
            killed = sum(o in ("fail", "timeout") for o in of_kind)
            lines.append(f"  {kind:11s} {killed:3d}/{len(of_kind):<3d}  {CLASSES[kind]}")
    killed = sum(o in ("fail", "timeout") for _, o in scored)
    if scored:
        lines.append(f"total: {killed}/{len(scored)} killed = {100 * killed / len(scored):.1f}% "
                     f"(+{len(results) - len(scored)} equivalent)")
    lines += [f"{'SURVIVED' if o == 'pass' else 'ERROR (tests do not run)'} {m.id} ({m.path}): {m.why}"
              for m, o in scored if o in ("pass", "error")]
    lines += [f"equivalent {m.id}: {m.equivalent}" for m, _, _ in results if m.equivalent]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=".", help="repository root (default .)")
    parser.add_argument("--only", help="comma-separated mutant ids (default: every one)")
    parser.add_argument("--check", action="store_true", help="only check that every find occurs exactly once")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per mutant (default 900)")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs pytest")
    parser.add_argument("--json", help="also write every outcome to this JSON file")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    mutants = load()
    if args.only:
        wanted = [i.strip() for i in args.only.split(",") if i.strip()]
        unknown = sorted(set(wanted) - {m.id for m in mutants})
        if unknown:
            parser.error(f"--only: no mutant {', '.join(unknown)}")
        mutants = [m for m in mutants if m.id in wanted]
    found = problems(root, mutants)
    print(f"{len(mutants)} hand-written mutant(s); {len(found)} problem(s)")
    for line in found:
        print(f"  {line}")
    if found or args.check:
        return 1 if found else 0
    signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(KeyboardInterrupt()))
    results = run(root, mutants, args.python, args.timeout)
    print()
    print(score(results))
    if args.json:
        Path(args.json).write_text(json.dumps([{"id": m.id, "class": m.kind, "path": m.path, "outcome": o,
                                                "seconds": round(s, 1), "equivalent": m.equivalent}
                                               for m, o, s in results], indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("hand_mutants.py: interrupted; the temporary copy was removed", file=sys.stderr)
        sys.exit(130)
