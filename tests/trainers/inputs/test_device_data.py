"""Per-device data folders (trainers/inputs/device_data.py, ``adaptplan split-data``, ``--device-data``):
the written files hold exactly the partition's rows, training on the folder equals training on the
data set, rank 0's view holds no sample, a device rank reads only its own files, and every damaged
or mismatched file is one InputError naming it."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from adaptplan.cli import main
from adaptplan.errors import InputError
from trainers.config.train_config import TrainConfig
from trainers.distributed import serve
from trainers.inputs.datasets import load_dataset
from trainers.inputs.device_data import read_manifest, write_device_folder
from trainers.inputs.partition import partition_indices
from trainers.run.driver import Trainer

SMALL = dict(dataset="synthetic", model="mlp", devices=3, rounds=3, cuts=(2,), algorithm="sfl-v1", eval_every=3,
             seed=5, progress=False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> tuple[Path, list[np.ndarray]]:
    data = load_dataset("synthetic")
    parts = partition_indices(data.y_train.numpy(), 3, "shards", 5, min_size=16)
    out = tmp_path_factory.mktemp("devices")
    write_device_folder(data, parts, out)
    return out, parts


def test_each_file_holds_its_devices_rows_and_the_manifest_describes_them(folder) -> None:
    out, parts = folder
    data = load_dataset("synthetic")
    manifest = read_manifest(out)
    assert [e.samples for e in manifest.devices] == [len(p) for p in parts]
    assert manifest.offsets == [0, len(parts[0]), len(parts[0]) + len(parts[1])]
    for i, part in enumerate(parts):
        x, y = manifest.load_device(i)
        assert torch.equal(x, data.x_train[part]) and torch.equal(y, data.y_train[part])
        assert list(manifest.devices[i].label_counts) == np.bincount(data.y_train[part].numpy(), minlength=10).tolist()
        assert manifest.devices[i].sha256 == hashlib.sha256((out / f"device-{i}.npz").read_bytes()).hexdigest()
    assert manifest.digest == hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    x_test, y_test = manifest.load_test()
    assert torch.equal(x_test, data.x_test) and torch.equal(y_test, data.y_test)
    whole = manifest.dataset(with_samples=True)
    rows = np.concatenate(manifest.parts())
    assert rows.tolist() == list(range(2000))
    assert torch.equal(whole.x_train, data.x_train[np.concatenate(parts)])


def test_rank_0s_view_has_the_partition_and_label_counts_but_no_sample(folder, tmp_path) -> None:
    out, parts = folder
    edge = tmp_path / "edge"
    edge.mkdir()
    for name in ("manifest.json", "test.npz"):              # no device file on the edge server's machine
        (edge / name).write_bytes((out / name).read_bytes())
    view = read_manifest(edge).dataset(with_samples=False)
    assert view.x_train.shape == (2000, 1, 8, 8) and view.x_train.stride()[0] == 0       # one sample, broadcast
    assert view.x_train.untyped_storage().nbytes() == 64 * 4
    assert float(view.x_train.abs().sum()) == 0.0
    data = load_dataset("synthetic")
    for i, rows in enumerate(read_manifest(edge).parts()):
        assert np.bincount(view.y_train[rows].numpy(), minlength=10).tolist() == \
            np.bincount(data.y_train[parts[i]].numpy(), minlength=10).tolist()


def test_training_on_the_folder_equals_training_on_the_data_set_it_was_split_from(tmp_path) -> None:
    assert main(["split-data", "--dataset", "synthetic", "--devices", "3", "--partition", "shards", "--seed", "5",
                 "--out", str(tmp_path / "f")]) == 0
    plain = Trainer(TrainConfig.flat(**SMALL, partition="shards")).run()
    on_folder = Trainer(TrainConfig.flat(**SMALL, device_data=str(tmp_path / "f"))).run()
    assert [r.train_loss for r in on_folder.records] == [r.train_loss for r in plain.records]
    assert on_folder.records[-1].accuracy == plain.records[-1].accuracy is not None


def test_a_device_rank_reads_only_its_own_devices_files(folder, tmp_path) -> None:
    out, parts = folder
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("manifest.json", "device-1.npz"):
        (mine / name).write_bytes((out / name).read_bytes())
    manifest = read_manifest(out)
    source = {"dataset": "synthetic", "model": "mlp", "model_width": 4, "device_data": manifest.digest}
    torch.manual_seed(0)
    from profilers.chain import build_chain
    from trainers.inputs.models import build_model

    initial = [b.state_dict() for b in build_chain(build_model("mlp", (1, 8, 8), 10, 4), torch.zeros(2, 1, 8, 8)).blocks]
    chain, samples = serve.local_chain(source, initial, serve.WorkerOptions(device_data=str(mine)), [1])
    x, y, local = samples(1, manifest.parts()[1][[0, 5, len(parts[1]) - 1]])
    assert local.tolist() == [0, 5, len(parts[1]) - 1] and x.shape[0] == len(parts[1])
    with pytest.raises(InputError, match="rank 0's positions of device 1 lie outside its"):
        samples(1, np.array([manifest.offsets[1] - 1]))
    with pytest.raises(InputError, match="'.*device-0.npz' not found"):
        serve.local_chain(source, initial, serve.WorkerOptions(device_data=str(mine)), [0])
    with pytest.raises(InputError, match="differs from rank 0's: give every rank the same manifest"):
        serve.local_chain(dict(source, device_data="0" * 64), initial, serve.WorkerOptions(device_data=str(mine)), [1])
    with pytest.raises(InputError, match="start every rank with --device-data DIR"):
        serve.local_chain(source, initial, serve.WorkerOptions(), [1])


def _rewrite(folder: Path, tmp_path: Path, device0: bytes | None = None, manifest: dict | None = None) -> Path:
    """A copy of ``folder`` with device 0's file (and the manifest's hash of it) replaced, or the manifest."""
    copy = tmp_path / "copy"
    copy.mkdir(exist_ok=True)
    for path in folder.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    doc = json.loads((folder / "manifest.json").read_text())
    if device0 is not None:
        (copy / "device-0.npz").write_bytes(device0)
        doc["devices"][0]["sha256"] = hashlib.sha256(device0).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(manifest if manifest is not None else doc))
    return copy


def _npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _entry_changed(folder: Path, **change) -> dict:
    doc = json.loads((folder / "manifest.json").read_text())
    doc["devices"][0].update(change)
    return doc


@pytest.mark.parametrize("damage, message", [
    (lambda f: dict(device0=_npz(x=np.zeros((5, 1, 8, 8), np.float32), y=np.full(5, 12))),
     "device-0.npz': labels span 12..12, outside 0..9"),
    (lambda f: dict(device0=_npz(x=np.zeros((5, 1, 8, 8), np.float64), y=np.zeros(5, np.int64))),
     "x is float64\\[5, 1, 8, 8\\] and y int64\\[5\\], expected float32\\[n, 1, 8, 8\\] and integer\\[n\\]"),
    (lambda f: dict(device0=_npz(x=np.full((5, 1, 8, 8), np.nan, np.float32), y=np.zeros(5, np.int64))),
     "x holds NaN or infinite values"),
    (lambda f: dict(device0=_npz(x=np.zeros((5, 1, 8, 8), np.float32))),
     "must hold exactly the arrays 'x' and 'y' \\(has \\['x'\\]\\)"),
    (lambda f: dict(device0=b"not a zip"), "device-0.npz' is not a readable .npz file"),
    (lambda f: dict(device0=_npz(x=np.zeros((5, 1, 8, 8), np.float32), y=np.zeros(5, np.int64))),
     "device-0.npz' holds 5 samples with label counts \\[5, 0, 0, 0, 0, 0, 0, 0, 0, 0\\], manifest.json says"),
    (lambda f: dict(manifest={"format": "something else"}), "is not a device-data manifest"),
    (lambda f: dict(manifest=_entry_changed(f, samples=3)), "device 0's entry is inconsistent"),
    (lambda f: dict(manifest=_entry_changed(f, owner="me")), "unknown key 'owner'; allowed: file, samples, label_counts"),
    (lambda f: dict(manifest=_entry_changed(f, file="other.npz")), "device 0's entry is inconsistent \\(file 'other.npz'"),
    (lambda f: dict(manifest=_entry_changed(f, sha256="0" * 64)), "device-0.npz' is not the file manifest.json names"),
])
def test_a_damaged_or_mismatched_folder_is_one_input_error_naming_the_file(folder, tmp_path, damage, message) -> None:
    out, _ = folder
    copy = _rewrite(out, tmp_path, **damage(out))
    with pytest.raises(InputError, match=message) as info:
        read_manifest(copy).load_device(0)
    assert info.value.field == "--device-data"


def test_cli_errors_name_the_flag_and_exit_2(folder, tmp_path, capsys) -> None:
    out, _ = folder
    assert main(["split-data", "--devices", "3", "--dataset", "synthetic", "--out", str(out)]) == 2
    assert "already holds a device-data folder; add --overwrite" in capsys.readouterr().err
    for empty in ("", "  "):            # found by the issue 36 harness: '' wrote into the working folder
        assert main(["split-data", "--devices", "3", "--dataset", "synthetic", "--out", empty]) == 2
        assert "--out: names no folder" in capsys.readouterr().err
    assert main(["train", "--model", "mlp", "--devices", "4", "--rounds", "1", "--cuts", "2", "--no-progress",
                 "--device-data", str(out)]) == 2
    assert "holds the data of 3 devices, --devices is 4" in capsys.readouterr().err
    assert main(["train", "--model", "mlp", "--devices", "3", "--rounds", "1", "--cuts", "2", "--no-progress",
                 "--device-data", str(tmp_path / "nothing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    with pytest.raises(InputError, match="with --device-data they stay on the devices") as info:
        TrainConfig.flat(**dict(SMALL, cuts=None), device_data=str(out), distributed=True, reestimate=True, replan_every=2)
    assert info.value.field == "reestimate"


def _tiny(num_classes: int, labels_per_device: list[list[int]]) -> tuple:
    """A data set of shape (1, 2, 2) whose device i holds the labels ``labels_per_device[i]``."""
    from trainers.inputs.datasets import Dataset

    y = torch.tensor([label for labels in labels_per_device for label in labels], dtype=torch.long)
    x = torch.arange(len(y) * 4, dtype=torch.float32).reshape(len(y), 1, 2, 2)
    data = Dataset(x, y, x[:2], y[:2], num_classes, (1, 2, 2), "tiny")
    bounds = np.cumsum([0] + [len(labels) for labels in labels_per_device])
    return data, [np.arange(a, b) for a, b in zip(bounds, bounds[1:])]


def test_the_smallest_valid_folder_two_classes_one_sample_reads_back(tmp_path) -> None:
    data, parts = _tiny(2, [[1], [0, 1, 1]])
    manifest = write_device_folder(data, parts, tmp_path / "a" / "b")     # missing parents are made
    assert manifest.num_classes == 2 and [e.samples for e in manifest.devices] == [1, 3]
    assert [e.label_counts for e in manifest.devices] == [(0, 1), (1, 2)]
    x, y = manifest.load_device(1)
    assert torch.equal(x, data.x_train[1:]) and y.tolist() == [0, 1, 1]
    text = (tmp_path / "a" / "b" / "manifest.json").read_text()
    assert text.startswith('{\n "format": "adaptplan-device-data",\n "version": 1,')
    assert '\n  {"file": "device-1.npz", "samples": 3, "label_counts": [1, 2], "sha256": "' in text   # a line per device
    assert manifest.local_positions(1, np.array([1, 3])).tolist() == [0, 2]        # the first and last of its rows
    for outside in ([0], [4], [0, 2], [1, 4]):                                   # with an inside one too
        with pytest.raises(InputError, match="rank 0's positions of device 1 lie outside its 3 samples"):
            manifest.local_positions(1, np.array(outside))
    for device in (-1, 2):
        with pytest.raises(InputError, match=f"device {device} is not in .*manifest.json \\(2 devices\\)"):
            manifest.load_device(device)


@pytest.mark.parametrize("change, message", [
    ({"version": 2}, "not an adaptplan-device-data version 1 manifest"),
    ({"format": "other"}, "not an adaptplan-device-data version 1 manifest"),
    ({"num_classes": 1}, "needs ≥ 2 classes"),
    ({"input_shape": []}, "needs ≥ 2 classes, an input shape"),
    ({"input_shape": [0, 2, 2]}, "needs ≥ 2 classes, an input shape"),
    ({"devices": []}, "and ≥ 1 device"),
    ({"devices": [{"file": "device-0.npz", "samples": 0, "label_counts": [0, 0], "sha256": ""}]}, "device 0's entry"),
    ({"devices": [{"file": "device-0.npz", "samples": 1, "label_counts": [-1, 2], "sha256": ""}]}, "device 0's entry"),
])
def test_a_manifest_out_of_range_is_refused(tmp_path, change, message) -> None:
    data, parts = _tiny(2, [[1], [0, 1, 1]])
    write_device_folder(data, parts, tmp_path)
    doc = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**doc, **change}))
    with pytest.raises(InputError, match=message):
        read_manifest(tmp_path)


@pytest.mark.parametrize("x, y, message", [
    (np.zeros((3, 1, 2, 2), np.float32), np.array([0, 1, 2]), "labels span 0..2, outside 0..1"),
    (np.zeros((3, 1, 2, 2), np.float32), np.array([-1, 1, 1]), "labels span -1..1, outside 0..1"),
    (np.array([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, np.inf], np.float32).reshape(3, 1, 2, 2), np.array([0, 1, 1]),
     "x holds NaN or infinite values"),
    (np.zeros((3, 1, 2, 2), np.float32), np.array([1, 1, 1]),         # 3 samples as the manifest says, other labels
     "holds 3 samples with label counts \\[0, 3\\], manifest.json says 3 with \\[1, 2\\]"),
    (np.array([None, 1], dtype=object), np.array([0, 1]), "is not a readable .npz file \\(ValueError\\)"),
])
def test_a_device_file_with_bad_contents_is_refused(tmp_path, x, y, message) -> None:
    data, parts = _tiny(2, [[1], [0, 1, 1]])
    write_device_folder(data, parts, tmp_path / "f")
    copy = _rewrite(tmp_path / "f", tmp_path, device0=_npz(x=x, y=y))
    doc = json.loads((copy / "manifest.json").read_text())
    doc["devices"][1]["sha256"] = doc["devices"][0]["sha256"]          # device 1's entry now names this file
    (copy / "device-1.npz").write_bytes((copy / "device-0.npz").read_bytes())
    (copy / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match=message):
        read_manifest(copy).load_device(1)


def _compressed(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def test_hostile_files_are_refused_before_they_are_read_or_decompressed(folder, tmp_path, monkeypatch) -> None:
    """Issue 36 D1/D2: a device file linked to /dev/zero was read forever; every member of an .npz was
    decompressed (a 1 MB file → 1 GB); test.npz had no hash in the manifest."""
    import trainers.inputs.device_data as device_data

    out, _ = folder
    good = read_manifest(out)
    x0, y0 = good.load_device(0)
    copy = _rewrite(out, tmp_path)
    if Path("/dev/zero").exists():
        (copy / "device-0.npz").unlink()
        (copy / "device-0.npz").symlink_to("/dev/zero")
        with pytest.raises(InputError, match="device-0.npz' is not a regular file") as info:
            read_manifest(copy).load_device(0)
        assert info.value.field == "--device-data"
        (copy / "device-0.npz").unlink()
    import os

    os.mkfifo(copy / "device-0.npz")                  # a named pipe: opening it used to block for ever
    with pytest.raises(InputError, match="device-0.npz' is not a regular file"):
        read_manifest(copy).load_device(0)
    (copy / "device-0.npz").unlink()
    bomb = _compressed(x=x0.numpy(), y=y0.numpy(), extra=np.zeros(10**7))      # 80 MB of zeros in a few kB
    assert len(bomb) < 10**6
    copy = _rewrite(out, tmp_path, device0=bomb)
    with pytest.raises(InputError, match="must hold exactly the arrays 'x' and 'y' \\(has \\['extra', 'x', 'y'\\]\\)"):
        read_manifest(copy).load_device(0)
    packed = _compressed(x=x0.numpy(), y=y0.numpy())                          # the same arrays, compressed
    copy = _rewrite(out, tmp_path, device0=packed)
    x, y = read_manifest(copy).load_device(0)
    assert torch.equal(x, x0) and torch.equal(y, y0)
    decompressed = x0.numpy().nbytes + y0.numpy().nbytes
    monkeypatch.setattr(device_data, "MAX_FILE_BYTES", decompressed - 1)    # the raw file fits, its arrays do not
    assert len(packed) < decompressed - 1
    with pytest.raises(InputError, match=f"its arrays take more than {decompressed - 1:,} bytes decompressed"):
        read_manifest(copy).load_device(0)
    monkeypatch.setattr(device_data, "MAX_FILE_BYTES", len(packed) - 1)
    with pytest.raises(InputError, match=f"holds {len(packed):,} bytes, more than the {len(packed) - 1:,}"):
        read_manifest(copy).load_device(0)
    monkeypatch.undo()
    copy = _rewrite(out, tmp_path)
    x_test, y_test = good.load_test()
    (copy / "test.npz").write_bytes(_npz(x=x_test.numpy()[::-1].copy(), y=y_test.numpy()[::-1].copy()))
    with pytest.raises(InputError, match="test.npz' is not the file manifest.json names"):
        read_manifest(copy).load_test()
    doc = json.loads((copy / "manifest.json").read_text())
    del doc["test_sha256"]                                  # a manifest written before the hash: read unchecked
    (copy / "manifest.json").write_text(json.dumps(doc))
    assert read_manifest(copy).load_test()[0].shape == x_test.shape


def _claiming(npz: bytes, member: str, size: int) -> bytes:
    """``npz`` with the decompressed size of ``member`` in its local and central zip headers set to ``size``
    (APPNOTE 4.3.7: the local header's size at offset 22, its name at 30; 4.3.12: the central one's at 24 and 46)."""
    import struct

    raw = bytearray(npz)
    for signature, size_at, name_length_at, name_at in ((b"PK\x03\x04", 22, 26, 30), (b"PK\x01\x02", 24, 28, 46)):
        at = raw.find(signature)
        while at >= 0:
            (length,) = struct.unpack("<H", raw[at + name_length_at:at + name_length_at + 2])
            if raw[at + name_at:at + name_at + length] == member.encode():
                raw[at + size_at:at + size_at + 4] = struct.pack("<I", size)
            at = raw.find(signature, at + 4)
    return bytes(raw)


def test_a_zip_directory_that_misstates_a_members_size_is_refused(folder, tmp_path) -> None:
    """Found by the issue 36 harness: a directory claiming 4 GiB for x.npy (under the cap) was read and trained on."""
    out, _ = folder
    x0, y0 = read_manifest(out).load_device(0)
    honest = _npz(x=x0.numpy(), y=y0.numpy())
    copy = _rewrite(out, tmp_path, device0=_claiming(honest, "x.npy", 2**32 - 16))   # more than its samples take
    with pytest.raises(InputError, match=f"x.npy claims {2**32 - 16:,} bytes decompressed, more than the "):
        read_manifest(copy).load_device(0)
    x_test, y_test = read_manifest(out).load_test()                 # test.npz has no sample count to bound it by
    lie = _claiming(_npz(x=x_test.numpy(), y=y_test.numpy()), "x.npy", 2**32 - 16)
    copy = _rewrite(out, tmp_path)
    (copy / "test.npz").write_bytes(lie)
    doc = json.loads((copy / "manifest.json").read_text())
    doc["test_sha256"] = hashlib.sha256(lie).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match=f"claims {2**32 - 16:,} bytes for x.npy, whose array holds "
                                         f"{x_test.numpy().nbytes:,}"):
        read_manifest(copy).load_test()
    with pytest.raises(InputError, match="device-0.npz"):                      # claiming less cuts the array short
        read_manifest(_rewrite(out, tmp_path, device0=_claiming(honest, "x.npy", 64))).load_device(0)
    x, y = read_manifest(_rewrite(out, tmp_path, device0=honest)).load_device(0)     # the same file, honest
    assert torch.equal(x, x0) and torch.equal(y, y0)


def test_a_device_file_is_bounded_by_what_its_manifest_samples_take(folder, tmp_path) -> None:
    """Issue 67 D2: a device file far larger than its samples need is refused unread, and an x member that is
    itself a zip bomb (50 kB claiming 50 MB of the right shape) is refused by its claimed size, undecompressed."""
    out, _ = folder
    x0, y0 = read_manifest(out).load_device(0)
    n, shape = x0.shape[0], tuple(x0.shape[1:])
    most = n * int(np.prod(shape)) * 4 + n * 8 + 2 * (2**16 + 16) + 4096       # x, y, two headers, the zip's own
    padded = _rewrite(out, tmp_path, device0=_npz(x=x0.numpy(), y=y0.numpy()) + b"\0" * most)
    with pytest.raises(InputError, match=rf"holds [\d,]+ bytes, more than the {most:,} its {n:,} samples in "
                                         "manifest.json can take"):
        read_manifest(padded).load_device(0)
    bomb = _compressed(x=np.zeros((5 * 10**7 // 4 // int(np.prod(shape)), *shape), dtype=np.float32), y=y0.numpy())
    assert len(bomb) < most
    with pytest.raises(InputError, match="x.npy claims [\\d,]+ bytes decompressed, more than the [\\d,]+ its samples"):
        read_manifest(_rewrite(out, tmp_path, device0=bomb)).load_device(0)


def test_a_valid_folder_reads_in_a_small_address_space(folder) -> None:
    """Issue 67 D6: every read reserved 8 GiB (the cap) however small the file, so a valid device file failed with
    MemoryError where the address space is below that (a Raspberry Pi-class device): read under a 2 GiB limit."""
    import subprocess
    import sys

    out, _ = folder
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30)); "
            "from pathlib import Path; from trainers.inputs import device_data as d; "
            "m = d.read_manifest(Path(sys.argv[1])); e = m.devices[0]; "
            "raw = d._read(m.folder / e.file, 2**33); x, y = d._arrays(m.folder / e.file, raw, m.input_shape, "
            "m.num_classes, e.samples); print(len(y) == e.samples, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0 and done.stdout.split() == ["True", "False"], done.stderr[-2000:]


def test_an_unreadable_manifest_is_named(tmp_path) -> None:
    (tmp_path / "manifest.json").mkdir()
    with pytest.raises(InputError, match="manifest.json' cannot be read"):
        read_manifest(tmp_path)


def test_split_data_flags_and_defaults(tmp_path, capsys) -> None:
    data = load_dataset("synthetic")
    assert main(["split-data", "--dataset", "synthetic", "--devices", "4", "--partition", "dirichlet",
                 "--out", str(tmp_path / "d")]) == 0
    assert capsys.readouterr().err.startswith(f"wrote {tmp_path / 'd'}: synthetic, 4 devices (")
    expected = partition_indices(data.y_train.numpy(), 4, "dirichlet", 0, 0.5, min_size=16)   # seed 0, α 0.5, b 16
    assert [e.samples for e in read_manifest(tmp_path / "d").devices] == [len(p) for p in expected]
    for argv, message in [(["--devices", "0"], "--devices: must be an integer in 1..10,000"),
                          ([], "the following arguments are required: --devices"),
                          (["--devices", "200"], "the smallest device gets 10 samples, fewer than --batch-size 16"),
                          (["--devices", "3", "--batch-size", "0"], "--batch-size: must be an integer in 1.."),
                          (["--devices", "3", "--batch-size", "667"], "the smallest device gets 666 samples, fewer")]:
        out = ["--out", str(tmp_path / "e")]
        assert main(["split-data", "--dataset", "synthetic", *argv, *out]) == 2
        assert message in capsys.readouterr().err
    assert main(["split-data", "--dataset", "synthetic", "--devices", "4", "--batch-size", "500", "--seed", "0",
                 "--out", str(tmp_path / "f")]) == 0                              # 500 each: b = 500 fits exactly
    capsys.readouterr()
    assert main(["split-data", "--dataset", "synthetic", "--devices", "3"]) == 2     # --out is required
    assert "the following arguments are required: --out" in capsys.readouterr().err


def test_split_data_writes_into_a_new_empty_or_device_data_folder_only(tmp_path, capsys) -> None:
    """Found by the issue 36 harness: ``--out /`` wrote the device files among the system's folders."""
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("x")
    for out, message in ((tmp_path / "home", "holds other files and no device-data folder"),
                         (tmp_path / "file", "is a file, not a folder")):
        assert main(["split-data", "--dataset", "synthetic", "--devices", "3", "--out", str(out)]) == 2
        assert f"--out: {str(out)!r} {message}" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == ["notes.txt"]
    (tmp_path / "empty").mkdir()
    argv = ["split-data", "--dataset", "synthetic", "--devices", "3", "--out", str(tmp_path / "empty")]
    assert main(argv) == 0
    assert main(argv) == 2 and "already holds a device-data folder; add --overwrite" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0


def test_manifest_values_of_another_kind_are_one_message(folder, tmp_path) -> None:
    """Found by the issue 36 harness: text or fractional counts were taken, num_classes Infinity was an
    OverflowError, a 100,000-deep array a RecursionError, ``test`` could name another file, a key could be twice."""
    import json

    out, _ = folder
    text = (out / "manifest.json").read_text()
    doc = json.loads(text)
    cases = {
        "samples as text": lambda d: d["devices"][0].update(samples=str(d["devices"][0]["samples"])),
        "samples as a fraction": lambda d: d["devices"][0].update(samples=d["devices"][0]["samples"] + 0.5),
        "float label counts": lambda d: d["devices"][0].update(label_counts=[float(c) for c in
                                                                             d["devices"][0]["label_counts"]]),
        "version true": lambda d: d.update(version=True),
        "num_classes as text": lambda d: d.update(num_classes="10"),
        "test names another file": lambda d: d.update(test="../manifest.json"),
        "name a list": lambda d: d.update(name=["x"]),
    }
    for name, edit in cases.items():
        copy = tmp_path / name.replace(" ", "_")
        copy.mkdir()
        changed = json.loads(json.dumps(doc))
        edit(changed)
        (copy / "manifest.json").write_text(json.dumps(changed))
        with pytest.raises(InputError, match="is not a device-data manifest|is inconsistent"):
            read_manifest(copy)
    for name, raw in {"infinity": text.replace('"num_classes": 10', '"num_classes": Infinity'),
                      "deep": text[:-2] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
                      "twice": text.replace('"num_classes": 10', '"num_classes": 10, "num_classes": 10')}.items():
        copy = tmp_path / name
        copy.mkdir()
        (copy / "manifest.json").write_text(raw)
        with pytest.raises(InputError, match="is not a device-data manifest"):
            read_manifest(copy)


def test_split_data_writes_whole_or_not_at_all(folder, tmp_path) -> None:
    """Issue 67: split-data on a full disk left a half-written folder. It writes beside --out and renames when
    complete; a failure leaves neither a new folder nor the temporary one, and an earlier folder stays as it was."""
    from adaptplan.cli.commands.split_data import write_whole

    def failing(data, parts, root):
        (root / "device-0.npz").write_bytes(b"half")
        raise InputError("No space left on device", field="--out")

    out = tmp_path / "devdata"
    with pytest.raises(InputError, match="No space left"):
        write_whole(None, None, out, failing)
    assert list(tmp_path.iterdir()) == []
    source, _ = folder
    earlier = {p.name: p.read_bytes() for p in source.iterdir()}
    out.mkdir()
    for name, raw in earlier.items():
        (out / name).write_bytes(raw)
    with pytest.raises(InputError, match="No space left"):
        write_whole(None, None, out, failing)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == earlier and [p.name for p in tmp_path.iterdir()] == ["devdata"]

    def honest(data, parts, root):
        for name, raw in earlier.items():
            (root / name).write_bytes(raw)

    assert write_whole(None, None, out, honest).total == read_manifest(source).total
    assert [p.name for p in tmp_path.iterdir()] == ["devdata"]
