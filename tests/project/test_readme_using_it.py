"""docs/usage.md's "Using it" commands all run, in order, from a fresh clone (issue 14); the README's ten-line
tour is their beginning, and the README's Python snippets run right after it, in the same folder (issue 65).

The ```bash block after "## Using it" is read from docs/usage.md (never copied here) and every line is
run, in the order written, in one empty working folder, so that a line may use what an earlier one
wrote (profile.json, system.json, constants.json, run folders). Each line is split as a shell
would (``#`` comments, quotes, ``runs/*`` expanded against that folder) and given to the function
the installed ``adaptplan`` command runs (pyproject.toml's ``[project.scripts]``), in this process:
a process per line would spend most of the test's time importing torch again. Every line must exit 0
and leave output that says it did what it claims (files parse, with the sizes the flags ask for).

The commands use small settings (about half a minute of CPU time in all; the README says what the
full-size ones are). A README line whose command has no check below fails
``test_every_line_is_one_checked_adaptplan_command``. That a resumed run is identical to an
uninterrupted one is tests/adaptplan/cli/test_train_cli.py's; here the resumed run keeps its earlier rounds.
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import shlex
import time
from itertools import product
from pathlib import Path
from typing import Callable

from adaptplan.cli import build_parser
from adaptplan.cli.commands.plan import parse_cuts
from adaptplan.constants import ConvergenceConstants
from adaptplan.model_profile import ModelProfile
from adaptplan.system import SystemSpec
from tests.cli_checks import adaptplan_entry_point
from tests.readme_blocks import bash_blocks, python_snippets, readme_section

PNG = b"\x89PNG\r\n\x1a\n"
LEARNS_WITHIN = 20   # rounds: a tour run this long must show learning (shorter ones say they only show that it runs)
LEARNED = 2.0        # ... by ending at least at this multiple of chance accuracy
SHELL_SYNTAX = re.compile(r"[|&;<>$`(){}]")   # pipes, redirections, variables, sub-shells: not used in the block


def using_it_lines() -> list[str]:
    blocks = bash_blocks(readme_section("Using it", "docs/usage.md"))
    assert len(blocks) == 1, f"the 'Using it' section should hold one bash block, has {len(blocks)}"
    return [line.strip() for line in blocks[0].splitlines() if line.strip()]


def words(line: str) -> list[str]:
    """``line`` split as bash splits it: comments dropped, quotes removed (globs expanded by :func:`argv`)."""
    return shlex.split(line, comments=True)


def argv(line: str) -> list[str]:
    """The arguments ``adaptplan`` gets from ``line`` run by bash in the working folder: a word with
    a wildcard becomes the sorted matching paths (kept as written when nothing matches)."""
    out: list[str] = []
    for word in words(line)[1:]:
        matches = sorted(glob.glob(word)) if glob.has_magic(word) else []
        out += matches or [word]
    return out


def is_png(path: str | Path) -> bool:
    return Path(path).is_file() and Path(path).read_bytes()[:8] == PNG


# --- what each command's output must show -------------------------------------------------------

def check_profile(args: argparse.Namespace, out: str, context: dict) -> None:
    found = re.search(r"^(\S+): input (\S+), (\d+) cut points", out, re.M)
    assert found and found.group(1) == args.model, out[:300]
    num_cuts = int(found.group(3))
    assert num_cuts >= 2
    rows = re.findall(r"^\s+(\d+)\s+\S+\s+\S+\s+[\d.]+\s+[\d.]+", out, re.M)   # j name output FP BP ...
    assert [int(j) for j in rows] == list(range(1, num_cuts + 1)), out
    if args.output:
        profile = ModelProfile.load(args.output)
        assert profile.model == args.model and profile.num_cuts == num_cuts
        assert list(profile.input_shape) == [int(v) for v in args.input.split("x")]
        assert all(c.fp_flops > 0 for c in profile.cut_points)
    if args.constants_out:
        constants = ConvergenceConstants.load(args.constants_out)
        assert constants.num_cuts == num_cuts              # sigma_j^2, G_j^2 measured at every cut
        assert constants.beta > 0 and constants.theta > 0 and constants.gamma == args.gamma


def check_system(args: argparse.Namespace, out: str, context: dict) -> None:
    system = SystemSpec.load(args.output)
    assert system.num_devices == args.devices
    if args.memory_bytes:
        low, high = args.memory_bytes
        assert all(low <= d.memory_bytes <= high for d in system.devices)
    else:
        assert not system.memory_limited


def check_plan(args: argparse.Namespace, out: str, context: dict) -> None:
    if args.json:
        plan = json.loads(out)
        system = SystemSpec.load(args.system) if args.system else None
        profile = ModelProfile.load(args.profile) if args.profile else None
        devices = system.num_devices if system else args.devices
        cuts = plan["cuts"]
        assert len(cuts) == devices
        assert all(1 <= c <= (profile.num_cuts if profile else c) for c in cuts)
        assert plan["interval"] >= 1 and plan["aggregations"] == plan["rounds"] // plan["interval"]
        if system is not None and system.memory_limited and profile is not None:   # every client part fits
            assert all(profile.cut_points[c - 1].client_memory_bytes <= d.memory_bytes
                       for c, d in zip(cuts, system.devices))
        used = set(cuts)
    else:
        found = re.search(r"^cuts used: (.+)$", out, re.M)
        assert found and "interval I =" in out, out[:500]
        used = {int(c) for c in re.findall(r"(?:^|, )(\d+) \(", found.group(1))}
        assert used
    if args.cuts:
        assert used <= set(parse_cuts(args.cuts))
    if args.backend == "cbc":
        assert "backend cbc" in out or "CBC" in context["err"]


def _records(folder: Path) -> list[dict]:
    return json.loads((folder / "history.json").read_text())["records"]


def _comparable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_seconds"} for r in records]


def before_train(args: argparse.Namespace) -> dict:
    folder = Path(args.out)
    return {"records": _records(folder)} if args.resume else {}


def check_train(args: argparse.Namespace, out: str, context: dict) -> None:
    folder = Path(args.out)
    history = json.loads((folder / "history.json").read_text())
    config, records, events = history["meta"]["config"], history["records"], history["events"]
    assert [r["round"] for r in records] == list(range(1, args.rounds + 1))
    evaluated = [r["round"] for r in records if r["accuracy"] is not None]
    assert evaluated and evaluated == [t for t in range(1, args.rounds + 1) if t % config["eval_every"] == 0]
    assert all(0 <= r["accuracy"] <= 1 for r in records if r["accuracy"] is not None)
    assert is_png(folder / "accuracy.png")
    assert len((folder / "history.csv").read_text().strip().splitlines()) == args.rounds + 1
    if args.rounds >= LEARNS_WITHIN:   # a tour run shows learning: it ends well above chance (issue 65)
        chance = 1 / history["meta"]["num_classes"]
        last = [r["accuracy"] for r in records if r["accuracy"] is not None][-1]
        assert last >= LEARNED * chance, f"{folder} ended at accuracy {last:.3f}, chance is {chance:.3f}"
    if args.resume:   # the rounds before the checkpoint are kept as they were, and the run goes on
        assert _comparable(records[:len(context["records"])]) == _comparable(context["records"])
        assert len(context["records"]) < args.rounds and config["rounds"] == args.rounds
        return
    for key in ("algorithm", "model", "devices", "partition"):
        assert config[key] == getattr(args, key), key
    from trainers.config.train_config import ALGORITHM_DEFAULTS  # --lr, else the algorithm's paper value

    assert config["lr"] == (args.lr if args.lr is not None else ALGORITHM_DEFAULTS[args.algorithm].lr)
    if args.partition == "dirichlet":
        assert config["dirichlet_alpha"] == args.dirichlet_alpha
    assert all(len(r["cuts"]) == args.devices for r in records)
    if args.checkpoint_every:   # the last checkpoint: the last multiple of --checkpoint-every, with this run's options
        from trainers.run.checkpoint import load_checkpoint

        state = load_checkpoint(folder)
        assert state["round"] == args.rounds - args.rounds % args.checkpoint_every
        assert state["config"]["checkpoint_every"] == args.checkpoint_every
    assert config["device_data"] == args.device_data
    if args.distributed:   # measured seconds per stage next to the simulated ones, every round
        assert all(set(r["measured_stage_seconds"]) == set(r["stage_seconds"]) for r in records)
    if args.cuts:
        wanted = list(args.cuts)   # one value: every device
        assert all(r["cuts"] == (wanted * args.devices if len(wanted) == 1 else wanted) for r in records)
    replans = {e["round"] for e in events if e["event"] in ("replan", "replan-infeasible")}
    if args.policy:   # the policy decides again at every aggregation
        assert events[0]["source"] == "policy" and events[0]["policy"] == args.policy
        aggregations = [r["round"] for r in records if r["aggregated"] and r["round"] < args.rounds]
        assert aggregations and set(aggregations) <= replans
    elif args.replan_every:
        assert events[0]["source"] == "planner" and replans and max(replans) <= args.rounds
    elif not args.cuts:
        assert events[0]["source"] == "planner"


def check_split_data(args: argparse.Namespace, out: str, context: dict) -> None:
    from trainers.inputs.device_data import read_manifest

    manifest = read_manifest(args.out)
    assert len(manifest.devices) == args.devices and manifest.name == args.dataset
    assert all((Path(args.out) / e.file).is_file() for e in manifest.devices)
    assert manifest.load_test()[0].shape[1:] == manifest.input_shape


def check_plot(args: argparse.Namespace, out: str, context: dict) -> None:
    if args.predicted_vs_measured:   # one distributed run: the table per stage, then the image
        stages = [line.split()[0] for line in out.strip().splitlines()[1:-1]]
        assert {"device", "uplink", "server", "downlink", "model", "round"} <= set(stages), out
        assert is_png(args.output)
        return
    assert len(args.runs) >= 2 and all((Path(r) / "history.json").is_file() for r in args.runs), args.runs
    assert is_png(args.output)


def check_bench(args: argparse.Namespace, out: str, context: dict) -> None:
    if args.bench == "solvers":
        title = "your instance" if args.profile else "default scenario"
        found = re.search(rf"^{title}: N=(\d+), (\d+) candidate cuts", out, re.M)
        assert found and "adaptsfl(bcd)" in out and "exact" in out, out[:500]
        if args.profile:   # the instance given: its devices, and candidates among its cut points
            assert int(found.group(1)) == SystemSpec.load(args.system).num_devices
            assert 1 <= int(found.group(2)) <= ModelProfile.load(args.profile).num_cuts
        if args.plot:
            assert is_png(args.plot)
    elif args.bench == "engine":
        assert all(f"{n} devices" in out for n in args.devices) and "samples/s" in out, out
        for row in ("adaptsfl (simulated)", "centralized, batch b", "centralized, batch N·b"):
            assert re.search(rf"^\s*{re.escape(row)}\s+\d+(\.\d+)?\s", out, re.M), (row, out)
    elif args.bench == "algorithms":
        results = json.loads((Path(args.out) / "results.json").read_text())
        ran = {(r["partition"], r["algorithm"]) for r in results["runs"]}
        assert ran == set(product(args.partitions.split(","), args.algorithms.split(",")))
        assert all(r["rounds"] == args.rounds and r["final_accuracy"] is not None for r in results["runs"])
        assert (Path(args.out) / "table.txt").read_text() in out and is_png(Path(args.out) / "accuracy.png")
    elif args.bench == "training":
        figures = json.loads(Path(args.json).read_text())
        partitions = ["iid", "shards"] if args.partitions == "both" else [args.partitions]
        assert list(figures["partitions"]) == partitions
        for partition in partitions:
            assert set(figures["partitions"][partition]) == set(args.policies.split(","))
        assert all(p["final_accuracy"] is not None for p in figures["policies"].values())
        assert (Path(args.out) / "table.txt").read_text() in out and is_png(Path(args.out) / "accuracy.png")
    else:
        raise AssertionError(f"no check for `adaptplan bench {args.bench}`")


# Each check gets the line's parsed flags, its stdout and a context: what BEFORE[command] read before
# the line ran (a resumed run's earlier records), and the line's stderr.
CHECKS: dict[str, Callable[[argparse.Namespace, str, dict], None]] = {
    "profile": check_profile, "system": check_system, "plan": check_plan, "train": check_train,
    "split-data": check_split_data, "plot": check_plot, "bench": check_bench,
}
BEFORE: dict[str, Callable[[argparse.Namespace], dict]] = {"train": before_train}


# --- the tests -----------------------------------------------------------------------------------

def readme_tour_lines() -> list[str]:
    tour = bash_blocks(readme_section("A ten-line tour"))
    assert len(tour) == 1
    return [line.strip() for line in tour[0].splitlines() if line.strip()]


def test_the_readmes_tour_is_the_tested_blocks_beginning() -> None:
    """The README's ten-line tour runs as written, in its order, from an empty folder: it is the first ten lines
    of the block run below (comments aside), and the README's Python snippets run right after them."""
    lines = readme_tour_lines()
    assert len(lines) == 10
    assert [words(line) for line in lines] == [words(line) for line in using_it_lines()[:len(lines)]]
    assert python_snippets()


def test_every_line_is_one_checked_adaptplan_command():
    lines = using_it_lines()
    assert len(lines) >= 10
    for line in lines:
        command = line.split("#", 1)[0]
        assert words(line)[0] == "adaptplan", line
        assert not SHELL_SYNTAX.search(command), f"shell syntax this test does not run: {line}"
        args = build_parser().parse_args(words(line)[1:])   # every flag exists (argparse exits 2 otherwise)
        assert args.command in CHECKS, f"no check for `adaptplan {args.command}`: {line}"


def test_using_it_commands_run_in_order_from_an_empty_folder(tmp_path, monkeypatch, capsys, record_property):
    for name in ("ADAPTPLAN_DATA_DIR", "ADAPTPLAN_DEBUG"):   # the shipped data/ of this clone, plain errors
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    adaptplan = adaptplan_entry_point()
    parser = build_parser()
    timings = []
    for number, line in enumerate(using_it_lines(), 1):
        arguments = argv(line)
        args = parser.parse_args(arguments)
        before = BEFORE.get(args.command, lambda a: {})(args)
        capsys.readouterr()
        start = time.perf_counter()
        code = adaptplan(arguments)
        timings.append((time.perf_counter() - start, line))
        out, err = capsys.readouterr()
        assert code == 0, f"README 'Using it' line {number} exited {code}: {line}\n{err[-2000:]}"
        try:
            CHECKS[args.command](args, out, {**before, "err": err})   # context: state before the run, stderr
        except Exception as exc:
            raise AssertionError(f"README 'Using it' line {number} did not do what it says: {line}\n{exc}") from exc
        if number == len(readme_tour_lines()):   # the README's tour is done: its Python snippets, as a reader runs them
            for index, snippet in enumerate(python_snippets(), 1):
                exec(compile(snippet, f"README.md python snippet {index}", "exec"), {"__name__": "__readme__"})
    record_property("seconds_per_line", [(round(seconds, 2), line) for seconds, line in timings])   # --junitxml
