"""``adaptplan provision``'s ranks at their edge (adaptplan/cli/commands/provision.py): W ranks give W − 2 device
hosts, so at most N + 2 ranks for N devices (one kit per host that has devices) — N + 2 is taken, N + 3 refused —
and the default is 2 + min(N, 8) (docs/distributed.md "Ranks and roles"). The deployment writer is replaced by a
recorder: nothing is written, no broker tool is needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptplan.cli import main
from trainers.distributed import provision as provision_module
from trainers.distributed.provision import Deployment

TRAIN = ["--", "--algorithm", "sfl-v1", "--cuts", "2", "--dataset", "synthetic", "--model", "mlp"]


@pytest.fixture
def written(monkeypatch) -> list[dict]:
    calls: list[dict] = []

    def record(folder: Path, address: str, num_devices: int, world: int, train_args: list[str], run=None,
               days: int = 365, largest_frame=lambda: None) -> Deployment:
        calls.append({"devices": num_devices, "world": world, "address": address})
        return Deployment(folder, folder / "broker", {r: folder / "kits" / f"rank{r}" for r in range(world)},
                          run or "r", "me")

    monkeypatch.setattr(provision_module, "provision", record)
    return calls


@pytest.mark.parametrize("devices, ranks", [(3, 5), (1, 3), (12, 14)])
def test_one_device_host_per_device_is_taken(tmp_path, capsys, written, devices: int, ranks: int) -> None:
    assert main(["provision", "--broker", "h:1", "--devices", str(devices), "--ranks", str(ranks),
                 "--out", str(tmp_path / "d"), *TRAIN]) == 0
    assert written == [{"devices": devices, "world": ranks, "address": "h:1"}]
    assert f"kits/rank0..rank{ranks - 1}" in capsys.readouterr().err


@pytest.mark.parametrize("devices, ranks", [(3, 6), (1, 4)])
def test_a_device_host_without_devices_is_refused(tmp_path, capsys, written, devices: int, ranks: int) -> None:
    assert main(["provision", "--broker", "h:1", "--devices", str(devices), "--ranks", str(ranks),
                 "--out", str(tmp_path / "d"), *TRAIN]) == 2
    assert (f"--ranks: {ranks} ranks give {ranks - 2} device hosts for {devices} devices: at most {devices + 2}"
            in capsys.readouterr().err)
    assert written == []


@pytest.mark.parametrize("devices, world", [(1, 3), (3, 5), (8, 10), (9, 10), (100, 10)])
def test_the_default_is_2_plus_min_n_8_ranks(tmp_path, written, devices: int, world: int) -> None:
    assert main(["provision", "--broker", "h:1", "--devices", str(devices), "--out", str(tmp_path / "d"), *TRAIN]) == 0
    assert written[-1]["world"] == world == 2 + min(devices, 8)
