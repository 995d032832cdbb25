#!/usr/bin/env python3
"""A small mutation-testing harness (standard library only; see docs/mutation.md).

    python tools/mutate.py solvers --tests "tests/solvers/test_dinkelbach.py tests/solvers/test_bcd.py" --sample 80 --seed 1

For every Python file under the given packages/files it enumerates single-point mutants with
:mod:`ast` — comparison swaps (``<``→``<=`` …), arithmetic swaps (``+``→``-``, ``*``→``/`` …),
constants (0↔1, n→n+1, True↔False), ``max``↔``min`` (also ``np.maximum``/``.max()``),
``floor``↔``ceil``, ``and``↔``or``, negated conditions, a deleted statement or return value, and
off-by-one slices/``range`` bounds — applies each one to a **temporary copy** of the repository
(the working tree is never edited), runs the chosen pytest command there with a per-mutant
timeout, and prints the kill score per file and per package plus every surviving mutant as
``file:line  kind  original → mutant``.

A mutant is *killed* when the tests fail (or time out), *survives* when they pass. Lines listed in
the skip file (default ``tools/mutation_skip.txt``: ``PATH | the line's code | why``, so that no
marker sits in the production code) or carrying ``# no-mutate`` are skipped; mutants listed in the equivalents file (default
``tools/mutation_equivalent.txt``, one key per line as printed under "survivors", ``#`` comments
allowed) are reported separately and left out of the score.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.pyc", "*.egg-info", ".pytest_cache", "runs", "out",
                                "build", "dist")
SKIP_MARK = "no-mutate"
SKIP_FILE = "tools/mutation_skip.txt"

_COMPARE_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                 ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_BINOP_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
               ast.Pow: ast.Mult, ast.Mod: ast.FloorDiv, ast.MatMult: ast.Mult}
_NAME_SWAP = {"max": "min", "min": "max", "maximum": "minimum", "minimum": "maximum", "floor": "ceil",
              "ceil": "floor", "argmax": "argmin", "argmin": "argmax", "any": "all", "all": "any",
              "amax": "amin", "amin": "amax"}


@dataclass(frozen=True)
class Mutant:
    """One single-point mutant: the ``index``-th mutation site of ``path`` (in traversal order)."""

    path: str       # relative to the repository root, POSIX separators
    index: int
    line: int
    kind: str
    original: str
    mutated: str

    @property
    def key(self) -> str:
        """Stable text that identifies the mutant (used in the equivalents file)."""
        return f"{self.path}:{self.line}: {self.kind}: {self.original} → {self.mutated}"


def _snippet(node: ast.AST, limit: int = 70) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Sites(ast.NodeTransformer):
    """Walks a module; in *list* mode records every mutation site, in *apply* mode rewrites site ``target``.

    Both modes visit nodes in the same order, so a site is identified by its ordinal number.
    """

    def __init__(self, skip_lines: set[int], target: int | None = None) -> None:
        self.skip_lines, self.target = skip_lines, target
        self.sites: list[tuple[int, str, str, str]] = []  # (line, kind, original, mutated)
        self.applied = False

    # -- helpers -----------------------------------------------------------------------------
    def _site(self, node: ast.AST, kind: str, make) -> ast.AST | None:
        """Register one site; ``make(node_copy)`` returns the mutated node. Returns the node to keep."""
        line = getattr(node, "lineno", 0)
        if line in self.skip_lines:
            return None
        index = len(self.sites)
        mutated = make(copy.deepcopy(node))
        self.sites.append((line, kind, _snippet(node), _snippet(mutated) if mutated is not None else "<deleted>"))
        if index == self.target:
            self.applied = True
            return mutated
        return None

    def _visit_children(self, node: ast.AST) -> ast.AST:
        return self.generic_visit(node)

    # -- nodes never mutated ------------------------------------------------------------------
    def visit_JoinedStr(self, node):  # f-strings: messages only
        return node

    def visit_AnnAssign(self, node):
        node.target = self.visit(node.target)
        if node.value is not None:
            node.value = self.visit(node.value)
        return node

    def visit_arg(self, node):  # annotations
        return node

    def visit_FunctionDef(self, node):
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        node.args = self.visit(node.args)
        node.body = self._body(node.body)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        node.body = self._body(node.body)
        return node

    def visit_Module(self, node):
        node.body = self._body(node.body)
        return node

    # -- statements: deletion ------------------------------------------------------------------
    def _body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out = []
        for k, stmt in enumerate(body):
            if k == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                out.append(stmt)  # docstring
                continue
            if _is_main_guard(stmt):
                out.append(stmt)  # script entry point
                continue
            if self._deletable(stmt):
                replaced = self._site(stmt, "delete statement", lambda s: ast.copy_location(ast.Pass(), s))
                if replaced is not None:
                    out.append(replaced)
                    continue
            new = self.visit(stmt)
            out.append(new)
        return out or [ast.Pass()]

    @staticmethod
    def _deletable(stmt: ast.stmt) -> bool:
        if isinstance(stmt, ast.Expr):
            return isinstance(stmt.value, ast.Call)
        if isinstance(stmt, (ast.AugAssign, ast.Raise, ast.Continue, ast.Break)):
            return True
        if isinstance(stmt, ast.Assign):  # assignments with a side effect on an object
            return any(isinstance(t, (ast.Attribute, ast.Subscript)) for t in stmt.targets)
        return False

    def visit_If(self, node):
        replaced = self._site(node.test, "negate condition", lambda t: ast.UnaryOp(op=ast.Not(), operand=t))
        node.test = replaced if replaced is not None else self.visit(node.test)
        node.body = self._body(node.body)
        node.orelse = self._body(node.orelse) if node.orelse else []
        return node

    def visit_While(self, node):
        replaced = self._site(node.test, "negate condition", lambda t: ast.UnaryOp(op=ast.Not(), operand=t))
        node.test = replaced if replaced is not None else self.visit(node.test)
        node.body = self._body(node.body)
        node.orelse = self._body(node.orelse) if node.orelse else []
        return node

    def visit_For(self, node):
        node.target = self.visit(node.target)
        node.iter = self.visit(node.iter)
        node.body = self._body(node.body)
        node.orelse = self._body(node.orelse) if node.orelse else []
        return node

    def visit_With(self, node):
        node.items = [self.visit(i) for i in node.items]
        node.body = self._body(node.body)
        return node

    def visit_Try(self, node):
        node.body = self._body(node.body)
        for handler in node.handlers:
            handler.body = self._body(handler.body)
        node.orelse = self._body(node.orelse) if node.orelse else []
        node.finalbody = self._body(node.finalbody) if node.finalbody else []
        return node

    def visit_Return(self, node):
        if node.value is not None and not (isinstance(node.value, ast.Constant) and node.value.value is None):
            replaced = self._site(node, "delete return value", lambda r: ast.copy_location(ast.Return(value=None), r))
            if replaced is not None:
                return replaced
        return self._visit_children(node)

    # -- expressions -----------------------------------------------------------------------------
    def visit_Compare(self, node):
        for k, op in enumerate(node.ops):
            swap = _COMPARE_SWAP.get(type(op))
            if swap is None:
                continue

            def make(n, k=k, swap=swap):
                n.ops[k] = swap()
                return n

            replaced = self._site(node, "comparison", make)
            if replaced is not None:
                return replaced
        return self._visit_children(node)

    def visit_BinOp(self, node):
        swap = _BINOP_SWAP.get(type(node.op))
        if swap is not None:
            def make(n, swap=swap):
                n.op = swap()
                return n

            replaced = self._site(node, "arithmetic", make)
            if replaced is not None:
                return replaced
        return self._visit_children(node)

    visit_AugAssign = visit_BinOp   # `x += y` swaps its operator exactly as `x + y` does

    def visit_UnaryOp(self, node):
        if isinstance(node.op, (ast.USub, ast.Not)):
            replaced = self._site(node, "drop unary operator", lambda n: n.operand)
            if replaced is not None:
                return replaced
        if isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            return node  # −k: one constant site is enough (the unary one above)
        return self._visit_children(node)

    def visit_BoolOp(self, node):
        def make(n):
            n.op = ast.Or() if isinstance(n.op, ast.And) else ast.And()
            return n

        replaced = self._site(node, "boolean operator", make)
        if replaced is not None:
            return replaced
        return self._visit_children(node)

    def visit_IfExp(self, node):
        replaced = self._site(node, "negate condition",
                              lambda n: ast.IfExp(test=ast.UnaryOp(op=ast.Not(), operand=n.test), body=n.body, orelse=n.orelse))
        if replaced is not None:
            return replaced
        return self._visit_children(node)

    def visit_Constant(self, node):
        value = node.value
        if isinstance(value, bool):
            new = not value
        elif isinstance(value, (int, float)):
            new = 1 if value == 0 else 0 if value == 1 else value + 1
            new = type(value)(new)
        else:
            return node
        replaced = self._site(node, "constant", lambda n: ast.copy_location(ast.Constant(value=new), n))
        return replaced if replaced is not None else node

    def visit_Call(self, node):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name in _NAME_SWAP:
            def make(n, new=_NAME_SWAP[name]):
                if isinstance(n.func, ast.Name):
                    n.func.id = new
                else:
                    n.func.attr = new
                return n

            replaced = self._site(node, "swap call", make)
            if replaced is not None:
                return replaced
        if isinstance(func, ast.Name) and func.id == "range" and node.args:
            def make(n):
                n.args[-1 if len(n.args) <= 2 else 1] = ast.BinOp(
                    left=n.args[-1 if len(n.args) <= 2 else 1], op=ast.Sub(), right=ast.Constant(1))
                return n

            replaced = self._site(node, "off-by-one range", make)
            if replaced is not None:
                return replaced
        return self._visit_children(node)

    def visit_Slice(self, node):
        if node.upper is not None:
            def make(n):
                n.upper = ast.BinOp(left=n.upper, op=ast.Sub(), right=ast.Constant(1))
                return n

            replaced = self._site(node, "off-by-one slice", make)
            if replaced is not None:
                return replaced
        if node.lower is not None:
            def make(n):
                n.lower = ast.BinOp(left=n.lower, op=ast.Add(), right=ast.Constant(1))
                return n

            replaced = self._site(node, "off-by-one slice", make)
            if replaced is not None:
                return replaced
        return self._visit_children(node)


def load_skips(path: Path | None) -> dict[str, frozenset[str]]:
    """The skip file: path → the (stripped) code of the lines not to mutate."""
    skips: dict[str, set[str]] = {}
    if path is not None and path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                file, code, _why = (part.strip() for part in line.split(" | ", 2))
                skips.setdefault(file, set()).add(code)
    return {file: frozenset(codes) for file, codes in skips.items()}


def _skip_lines(source: str, codes: frozenset[str] = frozenset()) -> set[int]:
    return {k for k, line in enumerate(source.splitlines(), start=1) if SKIP_MARK in line or line.strip() in codes}


def _is_main_guard(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare)
            and isinstance(stmt.test.left, ast.Name) and stmt.test.left.id == "__name__")


def _parse(source: str) -> ast.Module:
    return ast.parse(source)


def list_mutants(root: Path, path: str, skips: dict[str, frozenset[str]] | None = None) -> list[Mutant]:
    """Every mutation site of ``root/path`` (``skips``: :func:`load_skips`, default the root's skip file)."""
    source = (root / path).read_text(encoding="utf-8")
    skips = load_skips(root / SKIP_FILE) if skips is None else skips
    sites = _Sites(_skip_lines(source, skips.get(path, frozenset())))
    sites.visit(_parse(source))
    return [Mutant(path, k, *site) for k, site in enumerate(sites.sites)]


def mutated_source(source: str, index: int, skip_codes: frozenset[str] = frozenset()) -> str:
    """``source`` with its ``index``-th mutation site applied (as regenerated by ``ast.unparse``);
    ``skip_codes`` as :func:`list_mutants` used for the file."""
    sites = _Sites(_skip_lines(source, skip_codes), target=index)
    tree = sites.visit(_parse(source))
    if not sites.applied:
        raise IndexError(f"no mutation site {index}")
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def python_files(root: Path, targets: list[str]) -> list[str]:
    root = root.resolve()
    files: list[str] = []
    for target in targets:
        path = (root / target).resolve()
        if path.is_dir():
            files += sorted(p.relative_to(root).as_posix() for p in path.rglob("*.py") if "__pycache__" not in p.parts)
        elif path.suffix == ".py" and path.exists():
            files.append(path.relative_to(root).as_posix())
        else:
            raise SystemExit(f"mutate.py: {target} is neither a package folder nor a .py file under {root}")
    return list(dict.fromkeys(files))


def run_pytest(copy_root: Path, python: str, test_args: list[str], timeout: float) -> tuple[int | None, float]:
    """Run pytest in ``copy_root``: (its exit code, None on a time-out; seconds)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(copy_root))
    # -n 0: one process (pyproject's addopts would start a pytest-xdist worker per core for every mutant)
    command = [python, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider", *test_args]
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=copy_root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None, time.perf_counter() - start
    except BaseException:  # interrupted (Ctrl-C, SIGTERM): take the test run down with us
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return code, time.perf_counter() - start


def run_tests(copy_root: Path, python: str, test_args: list[str], timeout: float) -> tuple[str, float]:
    """Run pytest in ``copy_root``; return ("pass" | "fail" | "timeout", seconds)."""
    code, seconds = run_pytest(copy_root, python, test_args, timeout)
    return ("timeout" if code is None else "pass" if code == 0 else "fail"), seconds


def load_equivalents(path: Path | None) -> set[str]:
    if path is None or not path.exists():
        return set()
    keys = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("  #", 1)[0].strip()
        if line and not line.startswith("#"):
            keys.add(line)
    return keys


def package_of(path: str) -> str:
    return path.split("/", 1)[0] if "/" in path else "."


def score_table(results: list[tuple[Mutant, str]], equivalent: set[str]) -> str:
    """Per-file and per-package kill scores (equivalent mutants excluded)."""
    rows: dict[str, list[int]] = {}
    packages: dict[str, list[int]] = {}
    for mutant, outcome in results:
        if mutant.key in equivalent:
            continue
        killed = outcome in ("fail", "timeout")
        for table, name in ((rows, mutant.path), (packages, package_of(mutant.path))):
            entry = table.setdefault(name, [0, 0])
            entry[0] += killed
            entry[1] += 1
    lines = ["per file:"]
    for name, (killed, total) in sorted(rows.items()):
        lines.append(f"  {name:40s} {killed:4d}/{total:<4d} {100 * killed / total:5.1f}%")
    lines.append("per package:")
    for name, (killed, total) in sorted(packages.items()):
        lines.append(f"  {name:40s} {killed:4d}/{total:<4d} {100 * killed / total:5.1f}%")
    killed = sum(v[0] for v in packages.values())
    total = sum(v[1] for v in packages.values())
    if total:
        timeouts = sum(o == "timeout" for m, o in results if m.key not in equivalent)
        lines.append(f"total: {killed}/{total} killed = {100 * killed / total:.1f}% ({timeouts} of them by timeout; "
                     f"+{sum(m.key in equivalent for m, _ in results)} marked equivalent)")
    return "\n".join(lines)


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Single-point mutation testing on a temporary copy of the repository.")
    parser.add_argument("targets", nargs="+", help="package folders or .py files, relative to --root")
    parser.add_argument("--tests", default="tests", help='pytest arguments run for every mutant (default "tests"); '
                        "-x -q -n 0 -p no:cacheprovider are always added")
    parser.add_argument("--root", default=".", help="repository root (copied to a temporary folder; default .)")
    parser.add_argument("--sample", type=int, default=None, help="test only N mutants drawn at random (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of --sample (default 0)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per mutant (default: 3 × the unmutated run + 10); a timeout counts as killed")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs pytest (default: this one)")
    parser.add_argument("--equivalent", default="tools/mutation_equivalent.txt",
                        help="file of mutant keys judged equivalent (relative to --root)")
    parser.add_argument("--survivors-of", metavar="JSON", default=None,
                        help="re-test only the mutants that survived in an earlier run's --json file")
    parser.add_argument("--skip", default=SKIP_FILE, help="file of lines not to mutate (relative to --root)")
    parser.add_argument("--list", action="store_true", help="only list the (sampled) mutants")
    parser.add_argument("--json", default=None, help="also write every outcome to this JSON file")
    return parser


def select_mutants(mutants: list[Mutant], survivors_of: str | None, sample: int | None, seed: int) -> list[Mutant]:
    """The mutants to test: those that survived in the ``survivors_of`` JSON file (matched without the line number,
    so survivors are found again after edits above them), then ``sample`` of them drawn with ``seed``."""
    if survivors_of:
        unlined = lambda key: re.sub(r"^([^:]+):\d+: ", r"\1: ", key)  # noqa: E731
        previous = {r["key"] for r in json.loads(Path(survivors_of).read_text()) if r["outcome"] == "pass"}
        exact = {m.key for m in mutants} & previous
        moved = {unlined(k) for k in previous - exact}  # keys whose line changed: match by text
        mutants = [m for m in mutants if m.key in exact or unlined(m.key) in moved]
    if sample is not None and sample < len(mutants):
        mutants = sorted(random.Random(seed).sample(mutants, sample), key=lambda m: (m.path, m.index))
    return mutants


def unmutated_seconds(copy_root: Path, files: list[str], python: str, test_args: list[str]) -> float | None:
    """Seconds of the tests on the copy with every target file regenerated by ``ast.unparse`` (the form mutants are
    written in: the run also checks the round trip); None when they do not pass."""
    originals = {f: (copy_root / f).read_text(encoding="utf-8") for f in files}
    try:
        for f, text in originals.items():
            (copy_root / f).write_text(ast.unparse(_parse(text)) + "\n", encoding="utf-8")
        outcome, seconds = run_tests(copy_root, python, test_args, timeout=3600)
    finally:
        for f, text in originals.items():
            (copy_root / f).write_text(text, encoding="utf-8")
    return seconds if outcome == "pass" else None


def report(results: list[tuple[Mutant, str]], equivalent: set[str], json_path: str | None) -> None:
    """The score table, the survivors and the mutants marked equivalent; every outcome to ``json_path``."""
    print()
    print(score_table(results, equivalent))
    survivors = [m for m, o in results if o == "pass" and m.key not in equivalent]
    print(f"survivors ({len(survivors)}):")
    for m in survivors:
        print(f"  {m.key}")
    marked = [m for m, o in results if m.key in equivalent]
    if marked:
        print(f"marked equivalent ({len(marked)}):")
        for m in marked:
            print(f"  {m.key}  [{dict(results)[m]}]")
    if json_path:
        Path(json_path).write_text(json.dumps([{"key": m.key, "path": m.path, "line": m.line, "kind": m.kind,
                                                 "original": m.original, "mutated": m.mutated, "outcome": o,
                                                 "equivalent": m.key in equivalent} for m, o in results], indent=1))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupted)  # so the finally blocks restore files and remove the copy

    root = Path(args.root).resolve()
    files = python_files(root, args.targets)
    skips = load_skips(root / args.skip if args.skip else None)
    every = [m for f in files for m in list_mutants(root, f, skips)]
    mutants = select_mutants(every, args.survivors_of, args.sample, args.seed)
    equivalent = load_equivalents(root / args.equivalent if args.equivalent else None)
    print(f"{len(files)} file(s), {len(every)} mutation site(s), testing {len(mutants)}", flush=True)
    if args.list:
        for m in mutants:
            print(f"  {m.key}")
        return 0

    test_args = shlex.split(args.tests)
    results: list[tuple[Mutant, str]] = []
    with tempfile.TemporaryDirectory(prefix="mutate-") as tmp:
        copy_root = Path(tmp) / "repo"
        shutil.copytree(root, copy_root, ignore=IGNORE)
        seconds = unmutated_seconds(copy_root, files, args.python, test_args)
        if seconds is None:
            print(f"the unmutated tests do not pass; fix that first: {args.python} -m pytest {args.tests}")
            return 2
        timeout = args.timeout if args.timeout is not None else 3 * seconds + 10
        print(f"unmutated run: {seconds:.1f} s; per-mutant timeout {timeout:.0f} s", flush=True)
        for n, mutant in enumerate(mutants, start=1):
            target = copy_root / mutant.path
            original = target.read_text(encoding="utf-8")
            try:
                target.write_text(mutated_source(original, mutant.index, skips.get(mutant.path, frozenset())),
                                  encoding="utf-8")
                outcome, seconds = run_tests(copy_root, args.python, test_args, timeout)
            finally:
                target.write_text(original, encoding="utf-8")
            results.append((mutant, outcome))
            status = {"fail": "killed", "timeout": "killed (timeout)", "pass": "SURVIVED"}[outcome]
            print(f"[{n}/{len(mutants)}] {status:16s} {seconds:6.1f}s  {mutant.key}", flush=True)
    report(results, equivalent, args.json)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("mutate.py: interrupted; the temporary copy was removed", file=sys.stderr)
        sys.exit(130)
