"""The command line around training: the instance-level limits (adaptplan.plannable), the numeric
flag types, `adaptplan profile`'s shape and table, `adaptplan plot`'s labels and table, and what a
new user meets first (closed pipes, channels-last shapes, own models on the path)."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

from adaptplan import plannable
from adaptplan.errors import InputError


# ---- from test_cli_contracts.py (merged by subject) ----------------------------------------
# ---- plannable: stage latencies ---------------------------------------------------------------------------------
def _latency(monkeypatch, *, n=2, fp_up=None, down_bp=None, model_up=None, model_down=None, server=None,
             delta_last=1.0, edge_bps=(1.0, 1.0)):
    """check_latencies on a fake latency model (seconds per device × cut) and a fake profile/system."""
    zeros = np.zeros((n, 3))
    fake = types.SimpleNamespace(fp_up=zeros if fp_up is None else np.asarray(fp_up, float),
                                 down_bp=zeros if down_bp is None else np.asarray(down_bp, float),
                                 model_up=zeros if model_up is None else np.asarray(model_up, float),
                                 model_down=zeros if model_down is None else np.asarray(model_down, float),
                                 server_per_device=np.zeros(3) if server is None else np.asarray(server, float))
    monkeypatch.setattr(plannable, "LatencyModel", lambda profile, system: fake)
    profile = types.SimpleNamespace(delta=np.array([0.0, 0.0, delta_last]))
    system = types.SimpleNamespace(num_devices=n, edge_to_fed_bps=edge_bps[0], fed_to_edge_bps=edge_bps[1])
    plannable.check_latencies(profile, system)


def _message(call) -> str:
    with pytest.raises(InputError) as info:
        call()
    assert info.value.field == "system"
    return info.value.message


@pytest.mark.parametrize("stage, name", [("fp_up", "client FP + upload"), ("down_bp", "download + client BP"),
                                         ("model_up", "model upload to the fed server"),
                                         ("model_down", "model download from the fed server")])
def test_the_slowest_device_stage_is_named_with_its_device_and_cut(monkeypatch, stage, name) -> None:
    ok = [[1.0, 2.0, 1e9], [3.0, 1e9, 4.0]]                      # 10⁹ s exactly is still accepted
    _latency(monkeypatch, **{stage: ok})
    bad = [[1.0, 2.0, 1e9], [3.0, 2.5e9, 4.0]]                  # device 1 (0-based), cut 2 (1-based)
    assert _message(lambda: _latency(monkeypatch, **{stage: bad})) == (
        f"{name} of device 1 at cut 2 would take 2.5e+09 s, more than the 1e+09 s the planner handles; check the "
        "profile's FLOPs/bits against the system's FLOP/s and bit/s")
    assert "of device 0 at cut 3 would take inf s" in _message(lambda: _latency(monkeypatch, **{stage: [[0, 0, math.inf],
                                                                                                       [0, 0, 0]]}))
    assert "of device 0 at cut 1 would take nan s" in _message(lambda: _latency(monkeypatch, **{stage: [[math.nan, 0, 0],
                                                                                                       [0, 0, 0]]}))


def test_the_server_stage_is_every_devices_share(monkeypatch) -> None:
    _latency(monkeypatch, n=4, server=[1.0, 2.5e8, 3.0])          # 4 × 2.5e8 = 1e9: accepted
    assert _message(lambda: _latency(monkeypatch, n=4, server=[1.0, 2.6e8, 3.0])).startswith(
        "server FP + BP at cut 2 would take 1.04e+09 s, more than")


def test_the_edge_to_fed_transfer_uses_the_slower_direction(monkeypatch) -> None:
    # N models of δ_L bits over min(edge→fed, fed→edge) bit/s
    _latency(monkeypatch, n=4, delta_last=5e8, edge_bps=(2.0, 10.0))                   # 4 · 5e8 / 2 = 1e9
    assert _message(lambda: _latency(monkeypatch, n=4, delta_last=5e8, edge_bps=(10.0, 1.0))).startswith(
        "edge <-> fed server model transfer would take 2e+09 s")
    assert _message(lambda: _latency(monkeypatch, n=5, delta_last=5e8, edge_bps=(2.0, 10.0))).startswith(
        "edge <-> fed server model transfer would take 1.25e+09 s")


# ---- plannable: interval bound ----------------------------------------------------------------------------------
def _bound(monkeypatch, c, d):
    import adaptplan.convergence

    seen = {}

    class Fake:
        def __init__(self, constants, num_devices) -> None:
            seen["args"] = (constants, num_devices)
            self.c, self.d_per_cut = c, np.asarray(d, float)

    monkeypatch.setattr(adaptplan.convergence, "ConvergenceModel", Fake)
    plannable.check_interval_bound("K", 7)
    assert seen["args"] == ("K", 7)


def test_interval_bound_limit(monkeypatch) -> None:
    _bound(monkeypatch, 1.0, [0.0, 1e-18, 1.0])                  # √(c/d) = 10⁹ rounds exactly: accepted
    _bound(monkeypatch, 0.0, [0.0, 1e-30])                       # c ≤ 0: the planner explains it, not this check
    _bound(monkeypatch, -1.0, [1e-30])
    _bound(monkeypatch, 1.0, [0.0, 0.0])                         # no drift at all: no bound
    with pytest.raises(InputError) as info:
        _bound(monkeypatch, 4.0, [0.0, 1e-18, 1.0])              # the smallest non-zero d: √(4/1e-18) = 2e9
    assert info.value.field == "constants.G2"
    assert info.value.message == ("the smallest non-zero G_j^2 gives an interval bound sqrt(c/d) of 2e+09 rounds, more "
                                  "than 1e+09; write 0 for a block without gradient drift or use realistic beta, gamma "
                                  "and G2")
    with pytest.raises(InputError, match="sqrt\\(c/d\\) of inf rounds"):
        _bound(monkeypatch, 1e300, [1e-300])                     # c/d overflows


def test_check_plannable_runs_both_checks(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(plannable, "check_latencies", lambda p, s: calls.append(("latencies", p, s)))
    monkeypatch.setattr(plannable, "check_interval_bound", lambda k, n: calls.append(("bound", k, n)))
    plannable.check_plannable("P", types.SimpleNamespace(num_devices=9), "K")
    assert calls[0][:2] == ("latencies", "P") and calls[1] == ("bound", "K", 9)


# ---- numeric flags ----------------------------------------------------------------------------------------------
def test_int_and_float_flags_check_ranges_and_name_the_rule() -> None:
    from adaptplan.cli.flags import float_flag, int_flag, positive_float_flag

    seeds = int_flag(0, 10, "rounds")
    assert seeds("0") == 0 and seeds("10") == 10
    with pytest.raises(argparse.ArgumentTypeError, match="^must be an integer, got 'x'$"):
        seeds("x")
    with pytest.raises(argparse.ArgumentTypeError, match="^must be an integer in 0..10 rounds, got 11$"):
        seeds("11")
    frac = float_flag(0.0, 1.0, low_open=True)
    assert frac("1") == 1.0 and frac("1e-9") == 1e-9
    with pytest.raises(argparse.ArgumentTypeError, match="^must be a number, got 'a'$"):
        frac("a")
    for bad in ("0", "1.5", "nan", "inf"):
        with pytest.raises(argparse.ArgumentTypeError):
            frac(bad)
    closed_high = float_flag(0.0, 1.0, high_open=True)
    assert closed_high("0") == 0.0
    with pytest.raises(argparse.ArgumentTypeError):
        closed_high("1")
    positive = positive_float_flag()
    assert positive("1e-30") == 1e-30 and positive("1e30") == 1e30
    for bad in ("0", "1e-31", "1.1e30", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive(bad)


# ---- profile: --input and the table -----------------------------------------------------------------------------
def test_parse_shape_edges() -> None:
    from adaptplan.cli.commands.profile import parse_shape

    assert parse_shape("3x32x32") == (3, 32, 32) and parse_shape("1X28×28") == (1, 28, 28)
    assert parse_shape("1x4096x4096") == (1, 4096, 4096)                        # 2²⁴ values: the limit
    assert parse_shape("80") == (80,) and parse_shape(str(2**24)) == (2**24,)   # a text model's window
    for bad in ("3x32", "3x32x32x1", "0x32x32", "3x-1x32", "axbxc", "", "0"):
        with pytest.raises(InputError) as info:
            parse_shape(bad)
        assert info.value.field == "--input" and "expected CxHxW with three positive integers" in info.value.message
    with pytest.raises(InputError):
        parse_shape(str(2**24 + 1))
    with pytest.raises(InputError) as info:
        parse_shape("1x4096x4097")
    assert info.value.message == ("1x4096x4097 is 16,781,312 values per sample, more than the 16,777,216 that can be "
                                  "profiled")


def _cut(index, name, fp, bp, act, params, fp_s=None, bp_s=None):
    return types.SimpleNamespace(index=index, name=name, fp_flops=fp, bp_flops=bp, activation_bits=act,
                                 client_param_bits=params, fp_seconds=fp_s, bp_seconds=bp_s)


def test_profile_table_units_and_columns() -> None:
    from adaptplan.cli.commands.profile import format_table

    counting = {"forward": "fx", "backward": "2x forward", "zero_flop_ops": [],
                "check": {"relative_difference": -0.0123, "counter": "fvcore"}}
    profile = types.SimpleNamespace(
        model="m", input_shape=(3, 8, 8), num_cuts=2, bits_per_value=16, timing=None, flop_counting=counting,
        cut_points=[_cut(1, "conv", 2.5e9, 5e9, 3e6, 1.25e6), _cut(2, "a_rather_long_block_name", 1e9, 2e9, 4e5, 2e6)])
    lines = format_table(profile, [(4, 8, 8), (10,)]).splitlines()
    assert lines[0] == ("m: input 3x8x8, 2 cut points (cumulative per sample, 2 FLOPs per multiply-add, 16 bits per "
                        "value)")
    assert lines[1].split() == ["j", "name", "output", "FP", "GFLOPs", "BP", "GFLOPs", "act", "Mbit", "params", "Mbit"]
    # GFLOPs = FLOPs / 10⁹, Mbit = bits / 10⁶
    assert lines[2].split() == ["1", "conv", "4x8x8", "2.5000", "5.0000", "3.0000", "1.250"]
    assert lines[3].split() == ["2", "a_rather_long_block_name", "10", "1.0000", "2.0000", "0.4000", "2.000"]
    # the name column is as wide as the longest name (at least 16): the output column starts at one place
    assert lines[2].index("4x8x8") == lines[3].index("10 ") == lines[1].index("output")
    assert lines[4] == ("FLOPs: forward fx; backward 2x forward; forward total -1.2% vs fvcore (norm layers and pooling "
                        "count there as zero); counted as zero: none")
    assert len(lines) == 5

    short = types.SimpleNamespace(model="m", input_shape=(1, 2, 2), num_cuts=1, bits_per_value=32,
                                  timing={"repeats": 5, "batch_size": 16, "threads": 2}, flop_counting=None,
                                  cut_points=[_cut(1, "fc", 1e3, 2e3, 10.0, 20.0, fp_s=1.5e-3, bp_s=2.5e-6)])
    lines = format_table(short, [(10,)]).splitlines()
    assert lines[1].split()[-4:] == ["FP", "ms", "BP", "ms"]
    assert lines[2].split()[-2:] == ["1.500", "0.003"]                  # seconds per sample → ms
    assert lines[1].index("output") == len("  j  ") + 16 + 1            # a 16-wide name column, one space
    assert lines[3] == "time: median of 5 batches of 16, 2 threads" and len(lines) == 4


# ---- plot: labels, the predicted-vs-measured table and panels ----------------------------------------------------
def _record(t, accuracy, sim, predicted=None, measured=None, round_sim=1.0, measured_round=None):
    from trainers.run.history import RoundRecord

    return RoundRecord(t, 1.0, accuracy, None if accuracy is None else 0.5, sim, round_sim, 0.1 * t, 10, 10, 0, True,
                       False, [1, 1], 1, stage_seconds=predicted or {}, measured_stage_seconds=measured or {},
                       measured_round_seconds=measured_round)


def _spy_figures(monkeypatch) -> list:
    import matplotlib.pyplot as plt

    figures, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig) or close(fig))
    return figures


def test_plot_labels_runs_by_folder_and_algorithm(tmp_path, monkeypatch, capsys) -> None:
    from adaptplan.cli import main
    from trainers.run.history import History

    runs = {"psl": {"config": {"algorithm": "psl"}}, "mine": {"config": {"algorithm": "sfl-v1"}}, "bare": {}}
    for name, meta in runs.items():
        History([_record(1, 0.25, 2.0), _record(2, None, 3.0), _record(3, 0.5, 4.5)], meta=meta).save(
            (tmp_path / name).mkdir() or tmp_path / name)
    figures = _spy_figures(monkeypatch)
    out = tmp_path / "p"
    # a folder is labelled by its name, a history.json file by its folder's; what it trained is added (policy,
    # algorithm, model) where the name does not say it already
    assert main(["plot", str(tmp_path / "psl"), str(tmp_path / "mine" / "history.json"), str(tmp_path / "bare"), "-o",
                 str(out), "--title", "cost $5"]) == 0
    assert capsys.readouterr().out == f"{out}.png\n"
    (ax,) = figures[0].axes
    assert [line.get_label() for line in ax.get_lines()] == ["psl", "mine: sfl-v1", "bare"]
    # evaluated rounds only: accuracy against simulated seconds
    assert all(list(line.get_xdata()) == [2.0, 4.5] and list(line.get_ydata()) == [0.25, 0.5] for line in ax.get_lines())
    assert ax.get_title() == "cost \\$5" and ax.get_xlabel() == "simulated time (s)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["psl", "mine: sfl-v1", "bare"]
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plot", str(tmp_path / "psl"), "-o", str(tmp_path / "q.png")]) == 0
    assert figures[1].axes[0].get_title() == "Test accuracy vs simulated time"
    capsys.readouterr()
    (tmp_path / "empty").mkdir()                                  # a folder without a run: its history.json is named
    assert main(["plot", str(tmp_path / "empty"), "-o", str(tmp_path / "r.png")]) == 2
    assert capsys.readouterr().err == (f"adaptplan plot: error: runs: no history.json at "
                                       f"{str(tmp_path / 'empty' / 'history.json')!r}\n")
    assert main(["plot", str(tmp_path / "nothing.json"), "-o", str(tmp_path / "r.png")]) == 2
    assert f"runs: no history.json at {str(tmp_path / 'nothing.json')!r}" in capsys.readouterr().err


def test_predicted_vs_measured_table_and_panels(tmp_path, monkeypatch, capsys) -> None:
    from adaptplan.cli import main
    from trainers.run.history import History

    # two measured rounds: uplink predicted 1 and 3 s (mean 2), measured 3 and 5 s (mean 4: ratio 2); the server
    # predicted 0 s (no ratio); device FP never measured; rounds predicted 10, 20 s, measured 12, 18 s
    records = [_record(1, None, 10.0, {"device FP": 1.0, "uplink": 1.0, "server": 0.0}, {"uplink": 3.0, "server": 0.5},
                       round_sim=10.0, measured_round=12.0),
               _record(2, 0.5, 30.0, {"device FP": 1.0, "uplink": 3.0, "server": 0.0}, {"uplink": 5.0, "server": 1.5},
                       round_sim=20.0, measured_round=18.0),
               _record(3, 0.6, 40.0, {"uplink": 9.0}, round_sim=10.0)]              # not measured: left out
    History(records).save(tmp_path)
    figures = _spy_figures(monkeypatch)
    out = tmp_path / "pvm.png"
    assert main(["plot", "--predicted-vs-measured", str(tmp_path), "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["stage", "predicted", "s", "measured", "s", "measured/pred.", "rounds"]
    assert [line.split() for line in lines[1:4]] == [["uplink", "2", "4", "2×", "2"], ["server", "0", "1", "-", "2"],
                                                     ["round", "15", "15", "1×", "2"]]
    assert lines[4] == str(out) and len(lines) == 5
    bars, rounds = figures[0].axes
    heights = [p.get_height() for p in bars.patches]
    assert heights == [2.0, 0.0, 4.0, 1.0]                        # predicted per stage, then measured per stage
    assert [p.get_x() + p.get_width() / 2 for p in bars.patches] == pytest.approx([-0.2, 0.8, 0.2, 1.2])
    assert [t.get_text() for t in bars.texts] == ["2×"]           # the ratio above each pair with a prediction
    assert bars.texts[0].xy == (0, 4.0)
    assert [t.get_text() for t in bars.get_xticklabels()] == ["uplink", "server"]
    (predicted, measured) = rounds.get_lines()
    assert (list(predicted.get_xdata()), list(predicted.get_ydata())) == ([1, 2], [10.0, 20.0])
    assert (list(measured.get_xdata()), list(measured.get_ydata())) == ([1, 2], [12.0, 18.0])
    assert figures[0]._suptitle.get_text() == "Predicted vs measured seconds per stage"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert main(["plot", "--predicted-vs-measured", str(tmp_path), str(tmp_path), "-o", str(out)]) == 2
    assert "runs: --predicted-vs-measured draws one run, got 2" in capsys.readouterr().err
    plain = tmp_path / "plain"
    plain.mkdir()
    History([_record(1, 0.5, 1.0)]).save(plain)
    assert main(["plot", "--predicted-vs-measured", str(plain), "-o", str(out)]) == 2
    assert "runs: the run has no measured seconds: only a torch.distributed run" in capsys.readouterr().err


# ---- flags of profile and bench engine --------------------------------------------------------------------------
@pytest.mark.parametrize("flag, limit, unit", [("--repeats", 10_000, "passes"), ("--batches", 10_000, "mini-batches"),
                                               ("--time-batch-size", 4096, "samples"), ("--batch-size", 4096, "samples")])
def test_profile_count_flags_at_their_limits(flag, limit, unit, capsys) -> None:
    from adaptplan.cli import build_parser, main

    args = build_parser().parse_args(["profile", "cnn", "--input", "3x32x32", flag, str(limit)])
    assert getattr(args, flag[2:].replace("-", "_")) == limit
    assert main(["profile", "cnn", "--input", "3x32x32", flag, str(limit + 1)]) == 2
    assert (f"argument {flag}: must be an integer in 1..{limit:,} {unit}, got {limit + 1}"
            in capsys.readouterr().err)


def test_bench_engine_needs_an_algorithm_and_knows_all(monkeypatch, capsys) -> None:
    from adaptplan.benches import engine as bench_engine
    from adaptplan.cli import main
    from trainers.config.train_config import ALGORITHMS

    seen = {}

    class Result:
        def report(self):
            return "report"

    monkeypatch.setattr(bench_engine, "run_engine_bench", lambda w, e: seen.update(algorithms=w.algorithms) or Result())
    assert main(["bench", "engine", "--algorithm", " , ,"]) == 2
    assert capsys.readouterr().err == "adaptplan bench: error: --algorithm: name at least one algorithm\n"
    assert seen == {}
    assert main(["bench", "engine", "--algorithm", "all"]) == 0 and seen["algorithms"] == tuple(ALGORITHMS)
    assert main(["bench", "engine", "--algorithm", "psl, gas,"]) == 0 and seen["algorithms"] == ("psl", "gas")
    assert main(["bench", "engine", "--algorithm", "psl,nope"]) == 2
    assert "--algorithm: unknown value 'nope'" in capsys.readouterr().err


def test_bench_engine_python_defaults_are_the_commands() -> None:
    """run_engine_bench() with no arguments times what `adaptplan bench engine` times with no flags: every field of
    EngineWorkload at the flag's default, train's execution defaults."""
    import dataclasses
    import inspect

    from adaptplan.benches import engine as bench_engine
    from adaptplan.cli import build_parser
    from trainers.config.train_config import ExecutionConfig

    args = vars(build_parser().parse_args(["bench", "engine"]))
    workload = inspect.signature(bench_engine.run_engine_bench).parameters["workload"].default
    flags = {"algorithms": "algorithm", "count_flops": "flops"}
    shared = [f.name for f in dataclasses.fields(workload) if flags.get(f.name, f.name) in args]
    assert set(shared) == {"devices", "batch_size", "rounds", "cut", "algorithms", "model", "repeats", "clock",
                           "count_flops"}                                    # width, warmup, seed: Python only
    assert args["devices"] == [workload.devices]                             # one count: no sweep
    assert (args["algorithm"],) == workload.algorithms
    for name in set(shared) - {"devices", "algorithms"}:
        assert getattr(workload, name) == args[flags.get(name, name)], name
    for f in dataclasses.fields(ExecutionConfig):
        if f.name in args:
            assert f.default == args[f.name], f.name     # the engine's own per-device choice: "auto"


# ---- train --resume from the folder alone ----------------------------------------------------------------------
def test_resume_refuses_a_checkpoint_without_a_configuration(tmp_path, capsys) -> None:
    from adaptplan.cli import main
    from trainers.run.checkpoint import save_checkpoint

    for config in ("psl", None, [1, 2]):
        save_checkpoint({"round": 1, "config": config}, tmp_path)
        assert main(["train", "--out", str(tmp_path), "--resume"]) == 2
        err = capsys.readouterr().err          # checked as a run's state first: the fields it lacks, one line
        assert err.startswith(f"adaptplan train: error: --resume: the checkpoint {str(tmp_path / 'checkpoint.pt')!r} "
                              "lacks ['engine',") and err.count("\n") == 1, err


# ---- from test_cli_misc.py (merged by subject) ----------------------------------------
ROOT = Path(__file__).resolve().parents[3]


def test_closed_pipe_is_quiet():
    """`adaptplan plan | head -c 0`: the reader is gone before the plan is printed."""
    proc = subprocess.Popen([sys.executable, "-m", "adaptplan.cli", "plan"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=300)
    assert err == "", err
    assert proc.returncode in (0, 141)


def test_channels_last_input_is_one_line_with_the_fix():
    result = subprocess.run([sys.executable, "-m", "adaptplan.cli", "profile", "resnet18", "--input", "32x32x3"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "looks channels-last" in lines[0] and "3x32x32" in lines[0]


def test_own_model_from_the_working_directory_without_pythonpath(tmp_path):
    (tmp_path / "mymodels.py").write_text(textwrap.dedent("""
        from torch import nn
        def tiny(num_classes=10):
            return nn.Sequential(nn.Flatten(), nn.Linear(12, 5), nn.ReLU(), nn.Linear(5, num_classes))
    """))
    # -P: the working directory is not put on sys.path by Python (as for the `adaptplan` script);
    # PYTHONPATH names this checkout only, not tmp_path
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = "import sys; from adaptplan.cli import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run([sys.executable, "-P", "-c", code, "profile", "mymodels:tiny", "--input", "3x2x2"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "2 cut points" in result.stdout


def test_a_bench_whose_run_stops_on_a_signal_says_so_and_exits_128_plus_the_signal(tmp_path, monkeypatch, capsys) -> None:
    """A bench that trains in its own process (--workers 1) has its run's Trainer turn SIGTERM into an Interrupted:
    the command says where the run stopped and that the same command continues it, exit 143, no "internal error"
    (it printed one before)."""
    import signal

    from adaptplan.benches import papers
    from adaptplan.cli import main
    from trainers.run.folder import Interrupted

    def stopped(*args, **kwargs):
        raise Interrupted(signal.SIGTERM, 20621, str(tmp_path / "run"), f"adaptplan train --out {tmp_path / 'run'} --resume")

    monkeypatch.setattr(papers, "run_paper_bench", stopped)
    assert main(["bench", "papers", "--quick", "--paper", "gas", "--workers", "1", "--out", str(tmp_path / "out")]) == 143
    err = capsys.readouterr().err
    assert "adaptplan bench: interrupted by SIGTERM after round 20621; checkpoint and history saved in" in err
    assert "(or run the same command again: the bench continues its runs)" in err and "internal error" not in err


def test_a_bench_stopped_with_its_runs_in_workers_says_what_was_kept(tmp_path, monkeypatch, capsys) -> None:
    """SIGTERM to a bench whose runs train in worker processes raises BenchStopped in the main process (run_jobs
    then ends its workers): the command says so in one line and exits 143 — it exited silently before. Only
    `bench papers` keeps its runs in folders, so only it says that the same command continues them."""
    import signal

    from adaptplan.benches import algorithms, papers
    from adaptplan.benches.runs import BenchStopped
    from adaptplan.cli import main

    def stopped(*args, **kwargs):
        raise BenchStopped(signal.SIGTERM)

    monkeypatch.setattr(papers, "run_paper_bench", stopped)
    monkeypatch.setattr(algorithms, "run_algorithm_bench", stopped)
    assert main(["bench", "papers", "--quick", "--paper", "gas", "--out", str(tmp_path / "out")]) == 143
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == ("adaptplan bench: stopped by SIGTERM; each run in progress saved its round and checkpoint in its "
                   "folder under --out (a run killed after the 60-s grace keeps its last checkpoint): run the same "
                   "command again to continue them")
    assert main(["bench", "algorithms", "--out", str(tmp_path / "algorithms")]) == 143
    assert capsys.readouterr().err == "adaptplan bench: stopped by SIGTERM\n"
    with pytest.raises(SystemExit):                        # any other SystemExit is not the bench's to describe
        monkeypatch.setattr(papers, "run_paper_bench", lambda *a, **k: sys.exit(3))
        main(["bench", "papers", "--quick", "--paper", "gas", "--out", str(tmp_path / "out")])


def test_sigterm_while_a_bench_waits_on_its_workers_raises_bench_stopped() -> None:
    """The handler run_jobs installs turns SIGTERM into BenchStopped (the CLI's one line above), a SystemExit with
    code 143; the previous handler is back afterwards."""
    import os
    import signal

    from adaptplan.benches.runs import BenchStopped, _terminating_on_sigterm

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(BenchStopped) as info, _terminating_on_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
    assert info.value.signum == signal.SIGTERM and info.value.code == 143
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_argparse_error_holding_a_line_break_is_one_line_with_exit_code_2(capsys) -> None:
    """tools/hostile_provision.py: argparse echoed a value's line break, two lines; it is shown as \\n."""
    from adaptplan.cli import main

    assert main(["plan", "x\ny"]) == 2
    assert capsys.readouterr().err == "adaptplan: error: unrecognized arguments: x\\ny\n"
