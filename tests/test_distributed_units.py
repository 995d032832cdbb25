"""The torch.distributed runtime's pure parts, without processes: rank layout, stage ledgers, link
emulation and rates, the predicted-vs-measured table, the launcher's failure lines and environment."""

from __future__ import annotations

import json
import signal
from types import SimpleNamespace

import pytest
import torch

from trainers.distributed import environment, launch, timing
from trainers.distributed.control import Envelope, LinkRates
from trainers.distributed.layout import RankLayout, default_world_size
from trainers.history import History, RoundRecord
from trainers.messages import Activation, CutGradient, ModelDownload, ModelUpload
from trainers.protocol import EDGE, FED, Forward


def test_rank_layout_spreads_devices_round_robin_over_device_ranks() -> None:
    layout = RankLayout(world_size=4, num_devices=5)          # device ranks 2 and 3
    assert layout.device_ranks == [2, 3]
    assert [layout.rank_of(d) for d in range(5)] == [2, 3, 2, 3, 2]
    assert layout.devices_of(2) == [0, 2, 4] and layout.devices_of(3) == [1, 3]
    assert [layout.describe(r) for r in range(4)] == ["edge server", "fed server", "devices 0, 2, 4", "devices 1, 3"]
    assert RankLayout(3, 1).describe(2) == "device 0"
    with pytest.raises(ValueError, match="at least 3 ranks"):
        RankLayout(2, 4)
    assert [default_world_size(n) for n in (1, 3, 8, 20)] == [3, 5, 10, 10]


def test_stage_ledger_sums_per_participant_and_reports_the_longest() -> None:
    ledger = timing.StageLedger()
    ledger.add(0, "uplink", 0.5)
    ledger.add(0, "uplink", 0.25)           # a device with two steps in a round: its seconds add up
    ledger.add(1, "uplink", 0.6)
    ledger.add("edge", "server", 0.2)
    ledger.add(1, "device FP", -1.0)         # clock noise never makes a stage negative
    ledger.merge({"server": {"edge": 0.1}, "device BP": {2: 0.3}})
    assert ledger.summary() == pytest.approx({"uplink": 0.75, "server": 0.3, "device FP": 0.0, "device BP": 0.3})
    taken = ledger.take()
    assert taken["uplink"] == {0: 0.75, 1: 0.6}
    assert ledger.summary() == {}


def test_emulated_arrival_holds_a_message_for_its_size_over_the_rate(monkeypatch) -> None:
    now = [100.0]
    slept = []
    monkeypatch.setattr(timing.time, "time", lambda: now[0])
    monkeypatch.setattr(timing.time, "sleep", lambda s: slept.append(s))
    # 1,000 bytes over 8,000 bit/s take 1 s: sent at 99.5, due at 100.5 → held 0.5 s from now (100.0)
    assert timing.emulated_arrival(Envelope(None, 99.5, 8000.0, arrived=99.6), 1000) == pytest.approx(100.5)
    assert slept == [pytest.approx(0.5)]
    # arrived later than due: the real arrival counts, nothing held
    assert timing.emulated_arrival(Envelope(None, 98.0, 8000.0, arrived=100.0), 1000) == 100.0
    # no rate (no emulation): the real arrival
    assert timing.emulated_arrival(Envelope(None, 99.5, None, arrived=99.7), 10**9) == 99.7
    assert slept == [pytest.approx(0.5)]
    # charged for more than the message (eq. 25's copies): 3,000 bytes → due at 99.5 + 3 s
    assert timing.emulated_arrival(Envelope(None, 99.5, 8000.0, 3000, arrived=99.6), 1000) == pytest.approx(102.5)
    assert slept[-1] == pytest.approx(2.5)


def test_every_message_takes_its_links_rate_and_books_its_stage(monkeypatch) -> None:
    rates = LinkRates({0: {"up_bps": 1.0, "down_bps": 2.0, "fed_up_bps": 3.0, "fed_down_bps": 4.0}}, 5.0, 6.0)
    act = Activation(0, 1, 1, torch.zeros(1), torch.zeros(1, dtype=torch.long))
    up = ModelUpload(0, 1, "device", {}, 1.0)
    edge_up = ModelUpload(0, 1, "edge", {}, 1.0)
    down = ModelDownload(0, 1, "device", {})
    cases = [(act, 0, EDGE, 1.0), (CutGradient(0, 1, 1, None), EDGE, 0, 2.0), (up, 0, FED, 3.0), (up, 0, EDGE, 1.0),
             (edge_up, EDGE, FED, 5.0), (down, FED, 0, 4.0), (down, FED, EDGE, 6.0), (down, EDGE, 0, 4.0),
             (Forward(1, []), EDGE, 0, None)]
    for msg, sender, to, rate in cases:
        assert timing.link_rate(rates, msg, sender, to) == rate, (msg, sender, to)
        assert timing.link_rate(None, msg, sender, to) is None
    ledger = timing.StageLedger()
    for msg, receiver, who, stage in [(act, EDGE, 0, "uplink"), (up, FED, 0, "model upload"),
                                      (edge_up, FED, "edge", "model upload"), (down, None, 0, "model download"),
                                      (down, EDGE, "edge", "model download"), (CutGradient(0, 1, 1, None), None, 0,
                                                                              "downlink")]:
        assert timing.book_transfer(ledger, Envelope(msg, 10.0, arrived=10.25), receiver) is msg
        assert ledger.take() == {stage: {who: 0.25}}
    assert timing.book_transfer(ledger, Envelope(Forward(1, []), 10.0, arrived=11.0), EDGE) == Forward(1, [])
    assert ledger.take() == {}


def _record(t: int, predicted: dict, measured: dict, round_sim: float, round_wall: float | None) -> RoundRecord:
    return RoundRecord(t, 1.0, None, None, float(t), round_sim, float(t), 0, 0, 0, False, False, [1], 1,
                       stage_seconds=predicted, measured_stage_seconds=measured, measured_round_seconds=round_wall)


def test_stage_comparison_means_over_rounds_with_both_figures() -> None:
    history = History([
        _record(1, {"uplink": 1.0, "server": 0.0}, {"uplink": 1.5, "server": 0.2}, 2.0, 3.0),
        _record(2, {"uplink": 3.0, "server": 0.0, "model upload": 2.0}, {"uplink": 2.5, "server": 0.4,
                                                                          "model upload": 3.0}, 4.0, 5.0),
        _record(3, {"uplink": 9.0}, {}, 9.0, None),        # a simulated round: not compared
    ])
    rows = {r["stage"]: r for r in history.stage_comparison()}
    assert list(rows) == ["uplink", "server", "model upload", "round"]   # STAGES order, then the round
    assert rows["uplink"] == {"stage": "uplink", "predicted_s": 2.0, "measured_s": 2.0, "ratio": 1.0, "rounds": 2}
    assert rows["server"]["ratio"] is None and rows["server"]["measured_s"] == pytest.approx(0.3)
    assert rows["model upload"] == {"stage": "model upload", "predicted_s": 2.0, "measured_s": 3.0, "ratio": 1.5,
                                    "rounds": 1}
    assert rows["round"]["predicted_s"] == 3.0 and rows["round"]["measured_s"] == 4.0
    assert History([_record(1, {"uplink": 1.0}, {}, 1.0, None)]).stage_comparison() == []


def test_history_keeps_measured_seconds_through_json_and_csv(tmp_path) -> None:
    history = History([_record(1, {"uplink": 1.0}, {"uplink": 1.25}, 2.0, 3.5)])
    history.save(tmp_path)
    again = History.load(tmp_path)
    assert again.records[0].measured_stage_seconds == {"uplink": 1.25}
    assert again.records[0].measured_round_seconds == 3.5
    header = (tmp_path / "history.csv").read_text().splitlines()[0].split(",")
    assert "measured_stage_seconds" in header and "measured_round_seconds" in header


def test_launcher_failure_lines(tmp_path) -> None:
    layout = RankLayout(4, 4)
    (tmp_path / "rank1.log").write_text("noise\nadaptplan train: rank 1 (fed server) stopped: rank 0 (edge server) "
                                        "stopped: rank 3 (devices 1, 3) closed its connection\n")
    (tmp_path / "rank2.log").write_text("adaptplan train: rank 2 (devices 0, 2) ended: rank 0 (edge server) closed its "
                                        "connection (it died or was killed)\n")
    (tmp_path / "rank3.log").write_text("")
    line = launch._failure_line
    assert line(0, 0, layout, tmp_path, False) is None
    assert line(0, 3, layout, tmp_path, False) is None                 # rank 0 wrote its own line
    assert line(0, -signal.SIGKILL, layout, tmp_path, False) == "rank 0 (edge server) was killed by SIGKILL"
    assert line(1, 3, layout, tmp_path, False) is None                 # only relayed rank 0's reason
    assert line(2, 3, layout, tmp_path, False) == ("rank 2 (devices 0, 2) ended: rank 0 (edge server) closed its "
                                                   "connection (it died or was killed)")
    assert line(3, -signal.SIGKILL, layout, tmp_path, False) == "rank 3 (devices 1, 3) was killed by SIGKILL"
    assert line(3, 1, layout, tmp_path, False) == "rank 3 (devices 1, 3) exited with code 1"
    assert line(3, -signal.SIGTERM, layout, tmp_path, True) == ("rank 3 (devices 1, 3) did not stop within 5 s of the "
                                                                "failure and was terminated")


def test_rank_environment_is_torchruns_contract_on_loopback(monkeypatch) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    env = launch.rank_environment(2, 5, 29500)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME")} \
        == {"RANK": "2", "LOCAL_RANK": "2", "WORLD_SIZE": "5", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "GLOO_SOCKET_IFNAME": "lo"}
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth1")
    assert launch.rank_environment(0, 3, 1)["GLOO_SOCKET_IFNAME"] == "eth1"
    # the launcher's own secret and store replace whatever the user's environment had
    monkeypatch.setenv("ADAPTPLAN_SECRET_FILE", "/elsewhere/secret")
    env = launch.rank_environment(1, 3, 1, secret="s" * 64, store="/tmp/x/store")
    assert "ADAPTPLAN_SECRET_FILE" not in env
    assert (env["ADAPTPLAN_SECRET"], env["ADAPTPLAN_STORE_FILE"]) == ("s" * 64, "/tmp/x/store")


def test_the_store_file_and_the_wire_trace_come_from_the_environment(tmp_path) -> None:
    assert environment.store_file({"ADAPTPLAN_STORE_FILE": "/tmp/a/store"}) == "/tmp/a/store"
    assert environment.store_file({"ADAPTPLAN_STORE_FILE": ""}) is None and environment.store_file({}) is None
    assert environment.wire_trace(2, {}) is None
    record = environment.wire_trace(2, {"ADAPTPLAN_WIRE_TRACE": str(tmp_path)})
    frame = SimpleNamespace(src=0, dst=2, seq=5, tensors=(("float32", (4, 3)), ("int64", (4,))))
    record(frame)
    record(frame)
    lines = (tmp_path / "rank2.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"src": 0, "dst": 2, "seq": 5,
                                                     "tensors": [["float32", [4, 3]], ["int64", [4]]]}] * 2
