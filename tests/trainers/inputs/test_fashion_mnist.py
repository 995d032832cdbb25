"""Full Fashion-MNIST without a download (issue 70 item 1): Debian's dataset-fashion-mnist read where apt installs
it, a --data-root holding the same idx files, one message naming the package when neither is there, and idx files
checked as they are read (trainers/inputs/idx_files.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from adaptplan.cli import main
from adaptplan.errors import InputError
from tests.installed_data import needs_fashion_mnist
from trainers.inputs import datasets
from trainers.inputs.datasets import DEBIAN_FASHION_MNIST, FASHION_MNIST_FILES, load_dataset
from trainers.inputs.idx_files import read_idx


def _idx(values: np.ndarray) -> bytes:
    """The idx encoding of a uint8 array, written out: 0, 0, 0x08, d, the sizes big-endian, the bytes."""
    sizes = b"".join(int(n).to_bytes(4, "big") for n in values.shape)
    return bytes((0, 0, 8, values.ndim)) + sizes + values.astype(np.uint8).tobytes()


def _write_folder(folder: Path, n_train: int = 6, n_test: int = 4) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    arrays = (rng.integers(0, 256, (n_train, 28, 28)), rng.integers(0, 10, n_train),
              rng.integers(0, 256, (n_test, 28, 28)), rng.integers(0, 10, n_test))
    folder.mkdir(parents=True, exist_ok=True)
    for name, values in zip(FASHION_MNIST_FILES, arrays):
        (folder / name).write_bytes(gzip.compress(_idx(values)))
    return arrays


def test_a_data_root_with_the_packages_idx_files_is_read_as_written(tmp_path) -> None:
    """Images scaled to [0, 1] and normalised by the training split's mean and deviation, labels as written."""
    x_train, y_train, x_test, y_test = _write_folder(tmp_path / "fm")
    data = load_dataset("fashion-mnist", tmp_path / "fm")
    assert tuple(data.x_train.shape) == (6, 1, 28, 28) and tuple(data.x_test.shape) == (4, 1, 28, 28)
    assert data.y_train.tolist() == y_train.tolist() and data.y_test.tolist() == y_test.tolist()
    scaled = x_train / 255.0
    mean, std = scaled.mean(), scaled.std(ddof=1)           # torch.std: the unbiased deviation
    assert data.mean[0] == pytest.approx(mean, rel=1e-5) and data.std[0] == pytest.approx(std, rel=1e-4)
    assert np.allclose(data.x_test.numpy()[:, 0], (x_test / 255.0 - mean) / std, atol=1e-4)


def test_without_the_package_one_message_names_it(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST", tmp_path / "absent")
    with pytest.raises(InputError, match="apt-get install dataset-fashion-mnist") as caught:
        load_dataset("fashion-mnist")
    assert caught.value.field == "--data-root"
    assert main(["train", "--dataset", "fashion-mnist", "--devices", "2", "--rounds", "1", "--no-progress",
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dataset-fashion-mnist" in err and "Traceback" not in err


@pytest.mark.parametrize(("content", "message"), [
    (gzip.compress(bytes((0, 0, 8, 1)) + (5).to_bytes(4, "big") + bytes(4), mtime=0), "holds 4 values where its header says"),
    (gzip.compress(bytes((0, 0, 8, 1)) + (4).to_bytes(4, "big") + bytes(5)), "holds 5 values where its header says"),
    (gzip.compress(bytes((0, 0, 13, 1)) + (1).to_bytes(4, "big") + bytes(4)), "not an idx file of unsigned bytes"),
    (gzip.compress(bytes((0, 0, 8, 3)) + (1).to_bytes(4, "big")), "not an idx file of unsigned bytes"),
    (b"not gzip at all", "could not be read"),
], ids=["short", "long", "int32", "no sizes", "not gzip"])
def test_a_damaged_idx_file_is_one_message_naming_it(tmp_path, content: bytes, message: str) -> None:
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    path.write_bytes(content)
    with pytest.raises(InputError, match=message) as caught:
        read_idx(path, 1)
    assert str(path) in caught.value.message


@pytest.mark.parametrize("labels", [np.zeros(5), np.array([0, 1, 2, 3, 4, 10])], ids=["five for six", "label 10"])
def test_labels_that_do_not_pair_with_the_images_are_refused(tmp_path, labels: np.ndarray) -> None:
    _write_folder(tmp_path)
    (tmp_path / FASHION_MNIST_FILES[1]).write_bytes(gzip.compress(_idx(labels)))
    with pytest.raises(InputError, match="do not pair one label in 0..9 with each image"):
        load_dataset("fashion-mnist", tmp_path)
    (tmp_path / FASHION_MNIST_FILES[1]).write_bytes(gzip.compress(_idx(np.array([0, 1, 2, 3, 4, 9]))))
    assert load_dataset("fashion-mnist", tmp_path).y_train.tolist() == [0, 1, 2, 3, 4, 9]       # 9: the last class


@needs_fashion_mnist
def test_train_reads_the_full_set_from_the_package_and_trains(tmp_path) -> None:
    """The 60,000 + 10,000 images, the first labels and the per-pixel statistics Fashion-MNIST is known by; a
    run of `adaptplan train --dataset fashion-mnist` with no --data-root trains on them (2 rounds, 4 devices)."""
    data = load_dataset("fashion-mnist")
    assert (len(data.y_train), len(data.y_test)) == (60000, 10000)
    assert data.y_train[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]          # the published first labels
    assert np.bincount(data.y_train.numpy()).tolist() == [6000] * 10
    assert data.mean[0] == pytest.approx(0.2860, abs=1e-4) and data.std[0] == pytest.approx(0.3530, abs=1e-4)
    assert main(["train", "--dataset", "fashion-mnist", "--model", "mlp", "--devices", "4", "--rounds", "2",
                 "--cuts", "1", "--max-test-samples", "500", "--eval-every", "1", "--no-progress", "--threads", "1",
                 "--out", str(tmp_path / "run")]) == 0
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert history["meta"]["partition_skew"]["size_min"] == 60000 // 4 - 60000 // 40      # 10 % held out locally
    assert history["records"][-1]["accuracy"] is not None
