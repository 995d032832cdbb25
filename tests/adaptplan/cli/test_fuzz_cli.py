"""Fuzz the CLI's file readers in-process with the seeded corpus of tests/fuzz_corpus.py.

Every mutated profile / system / constants file goes through ``adaptplan plan``, every plan file
through ``adaptplan train --plan`` (with ``--checkpoint-every`` but no ``--out``, so a plan that
loads stops at that check instead of training), every history through ``adaptplan plot``. Each case must end with
exit code 0, or exit code 2 and exactly one line ``adaptplan CMD: error: ...`` on stderr — never a
traceback, never "internal error" (exit 1). The case count is bounded (no wall-clock limit).

Run ``python -m tests.adaptplan.cli.test_fuzz_cli [SEED] [PER_KIND]`` for the counts of a larger corpus.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli_checks import run_cli
from tests.fuzz_corpus import Case, base_documents, generate

SEED = 17
PER_KIND = 110          # JSON field mutations per file kind; with the TOML and whole-file cases 715 in all


@dataclass(frozen=True)
class Outcome:
    case: Case
    code: int
    stdout: str
    stderr: str

    @property
    def clean_error(self) -> bool:
        lines = self.stderr.strip().splitlines()
        return self.code == 2 and len(lines) == 1 and lines[0].startswith("adaptplan ") and ": error: " in lines[0]

    @property
    def accepted(self) -> bool:
        return self.code == 0 and "Traceback" not in self.stderr

    @property
    def names_the_file(self) -> bool:
        return self.clean_error and "fuzzed" in self.stderr


def write_valid(folder: Path) -> dict[str, Path]:
    import json

    paths = {}
    for kind, doc in base_documents().items():
        paths[kind] = folder / f"{kind}.json"
        paths[kind].write_text(json.dumps(doc))
    return paths


def argv_for(case: Case, fuzzed: Path, valid: dict[str, Path], folder: Path) -> list[str]:
    if case.kind in ("profile", "system", "constants"):
        files = {k: str(valid[k]) for k in ("profile", "system", "constants")}
        files[case.kind] = str(fuzzed)
        return ["plan", "--profile", files["profile"], "--system", files["system"], "--constants", files["constants"],
                "--json"]
    if case.kind == "plan":
        return ["train", "--plan", str(fuzzed), "--checkpoint-every", "1", "--no-progress"]   # no --out: stops
    return ["plot", str(fuzzed), "-o", str(folder / "plot.png")]


def run_case(case: Case, folder: Path, valid: dict[str, Path], number: int) -> Outcome:
    fuzzed = folder / f"fuzzed{number}{case.suffix}"
    fuzzed.write_bytes(case.data)
    code, stdout, stderr = run_cli(argv_for(case, fuzzed, valid, folder))
    fuzzed.unlink()
    return Outcome(case, code, stdout, stderr)


def run_corpus(cases: list[Case], folder: Path) -> list[Outcome]:
    valid = write_valid(folder)
    return [run_case(case, folder, valid, n) for n, case in enumerate(cases)]


def summarise(outcomes: list[Outcome]) -> dict[str, int]:
    return {"cases": len(outcomes), "clean errors": sum(o.clean_error for o in outcomes),
            "acceptances": sum(o.accepted for o in outcomes),
            "errors naming the file": sum(o.names_the_file for o in outcomes),
            "tracebacks": sum("Traceback" in o.stderr for o in outcomes),
            "other": sum(not (o.clean_error or o.accepted) for o in outcomes)}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> list[Outcome]:
    return run_corpus(generate(SEED, PER_KIND), tmp_path_factory.mktemp("fuzz"))


def test_corpus_is_large_and_covers_every_kind(outcomes):
    assert len(outcomes) >= 500
    assert sum(o.case.suffix == ".toml" for o in outcomes) >= 100
    assert set(Counter(o.case.kind for o in outcomes)) == set(base_documents())


def test_every_case_ends_in_exit_0_or_one_clean_message(outcomes):
    bad = [f"{o.case.kind} {o.case.description}: exit {o.code}: {o.stderr[-300:]}"
           for o in outcomes if not (o.clean_error or o.accepted)]
    assert not bad, f"{len(bad)} of {len(outcomes)} cases failed:\n" + "\n".join(bad[:20])


def test_file_errors_name_the_file(outcomes):
    """A field error of one file names that file (the cross-file checks, e.g. constants vs profile
    lengths or an unreachable target, name the field only)."""
    errors = [o for o in outcomes if o.clean_error]
    assert sum(o.names_the_file for o in errors) >= 0.9 * len(errors)


def test_the_unmutated_files_are_accepted(outcomes):
    valid = [o for o in outcomes if o.case.description in ("valid", "valid TOML")]
    assert len(valid) == 10
    for o in valid:
        if o.case.kind == "plan":   # loads, then stops at the check that --checkpoint-every needs --out
            assert o.code == 2 and "--checkpoint-every: needs --out" in o.stderr, o.stderr
        else:
            assert o.code == 0, o.stderr


def test_corpus_is_deterministic_in_the_seed():
    assert [c.data for c in generate(SEED, 10)] == [c.data for c in generate(SEED, 10)]
    assert [c.data for c in generate(SEED, 10)] != [c.data for c in generate(SEED + 1, 10)]


if __name__ == "__main__":  # pragma: no cover
    import tempfile
    import time

    seed = int(sys.argv[1]) if len(sys.argv) > 1 else SEED
    per_kind = int(sys.argv[2]) if len(sys.argv) > 2 else PER_KIND
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = run_corpus(generate(seed, per_kind), Path(tmp))
    print(summarise(result), f"{time.perf_counter() - start:.1f} s")
    for o in result:
        if not (o.clean_error or o.accepted):
            print(f"{o.case.kind} {o.case.description}: exit {o.code}: {o.stderr.strip()[-400:]}")
