"""Datasets (trainers.inputs.datasets): real offline data, normalisation, errors instead of downloads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaptplan.errors import InputError
from trainers.inputs.datasets import MNIST_TRAIN_SIZE, dataset_names, find_data_dir, load_dataset


def test_cifar10_subset_shapes_labels_and_normalisation() -> None:
    d = load_dataset("cifar10-subset")
    assert d.x_train.shape == (5085, 3, 32, 32) and d.x_test.shape == (1017, 3, 32, 32)
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    assert (d.num_classes, d.input_shape) == (10, (3, 32, 32))
    assert set(d.y_train.unique().tolist()) == set(range(10))
    means = d.x_train.mean(dim=(0, 2, 3))
    stds = d.x_train.std(dim=(0, 2, 3))
    assert torch.allclose(means, torch.zeros(3), atol=1e-4) and torch.allclose(stds, torch.ones(3), atol=1e-4)
    # per-channel pixel means of the subset (README: 125.9, 123.6, 114.3 on 0..255)
    assert np.allclose(np.array(d.mean) * 255, [125.9, 123.6, 114.3], atol=0.1)


def test_mnist_is_a_fixed_disjoint_split_of_the_test_set() -> None:
    a, b = load_dataset("mnist"), load_dataset("mnist-subset")
    assert a.x_train.shape == (MNIST_TRAIN_SIZE, 1, 28, 28) and a.x_test.shape == (10000 - MNIST_TRAIN_SIZE, 1, 28, 28)
    assert torch.equal(a.y_train, b.y_train) and torch.equal(a.x_test, b.x_test)  # same seed, same split
    raw = np.load(find_data_dir() / "mnist_test.npz")
    counts = np.bincount(raw["y"], minlength=10)
    assert (np.bincount(a.y_train.numpy(), minlength=10) + np.bincount(a.y_test.numpy(), minlength=10) == counts).all()
    train_rows = {row.tobytes() for row in a.x_train.numpy()}
    assert not any(row.tobytes() in train_rows for row in a.x_test.numpy()[:200])


def test_synthetic_is_the_documented_size() -> None:
    """module docstring: 10 classes of 1×8×8 Gaussian clusters, 2,000 train / 400 test samples, fixed seed."""
    d, again = load_dataset("synthetic"), load_dataset("synthetic")
    assert d.x_train.shape == (2000, 1, 8, 8) and d.x_test.shape == (400, 1, 8, 8)
    assert d.y_train.shape == (2000,) and d.y_test.shape == (400,) and set(d.y_train.tolist()) == set(range(10))
    assert (d.num_classes, d.input_shape, d.name) == (10, (1, 8, 8), "synthetic")
    assert torch.equal(d.x_train, again.x_train) and torch.equal(d.y_test, again.y_test)


def test_unknown_dataset_lists_valid_names() -> None:
    with pytest.raises(InputError, match="--dataset.*cifar10-subset.*fashion-mnist"):
        load_dataset("imagenet")
    assert "cifar100" in dataset_names()
    from trainers.config.train_config import DATASETS
    from trainers.inputs.datasets import LOADERS

    assert tuple(LOADERS) == DATASETS == tuple(dataset_names())      # one loader per name the configuration accepts


def test_missing_files_are_input_errors_never_downloads(tmp_path, monkeypatch) -> None:
    with pytest.raises(InputError, match="cifar10_subset.npz not found"):
        load_dataset("cifar10-subset", root=tmp_path)
    with pytest.raises(InputError, match="--data-root"):
        load_dataset("cifar10")  # torchvision data needs a root
    with pytest.raises(InputError, match="not found"):
        load_dataset("cifar10", root=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing downloaded
    monkeypatch.setenv("ADAPTPLAN_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(InputError, match="ADAPTPLAN_DATA_DIR"):
        load_dataset("mnist")


def test_data_dir_env_variable_is_used(tmp_path, monkeypatch) -> None:
    source = np.load(find_data_dir() / "mnist_test.npz")
    np.savez(tmp_path / "mnist_test.npz", x=source["x"][:10000], y=source["y"])
    monkeypatch.setenv("ADAPTPLAN_DATA_DIR", str(tmp_path))
    assert find_data_dir() == tmp_path
    assert load_dataset("mnist").x_train.shape[0] == MNIST_TRAIN_SIZE


def test_shipped_files_are_the_projects_own() -> None:
    import hashlib
    import re

    from trainers.inputs.datasets import PROJECT_DATA_DIR

    assert find_data_dir() == PROJECT_DATA_DIR or "ADAPTPLAN_DATA_DIR" in __import__("os").environ
    # the bytes are the ones data/README.md documents (its table's sha256 column), not merely files of that name
    readme = (PROJECT_DATA_DIR / "README.md").read_text(encoding="utf-8")
    documented = dict(re.findall(r"^\| `([\w.]+\.npz)` \|.*\| `([0-9a-f]{64})` \|$", readme, flags=re.M))
    assert set(documented) == {"cifar10_subset.npz", "mnist_test.npz"}
    for name, digest in documented.items():
        assert hashlib.sha256((PROJECT_DATA_DIR / name).read_bytes()).hexdigest() == digest, name


def test_no_data_folder_names_the_file_and_how_to_get_it(tmp_path, monkeypatch) -> None:
    import trainers.inputs.datasets as ds

    monkeypatch.delenv("ADAPTPLAN_DATA_DIR", raising=False)
    monkeypatch.setattr(ds, "PROJECT_DATA_DIR", tmp_path / "absent")
    with pytest.raises(InputError, match="data folder .*absent.* missing.*ADAPTPLAN_DATA_DIR.*git clone"):
        load_dataset("cifar10-subset")
    monkeypatch.setattr(ds, "PROJECT_DATA_DIR", tmp_path)
    with pytest.raises(InputError, match=r"cifar10_subset\.npz not found in .*the project's data folder.*data/ folder"):
        load_dataset("cifar10-subset")


def test_labels_anywhere_in_the_class_range_are_accepted(tmp_path) -> None:
    x = np.zeros((10, 1, 28, 28), np.uint8)
    for labels in (np.full(10, 9), np.full(10, 0), np.arange(10)):      # one class only, or all ten
        _write_mnist(tmp_path, x=x, y=labels.astype(np.uint8))
        d = load_dataset("mnist-subset", root=tmp_path)
        assert sorted(torch.cat([d.y_train, d.y_test]).tolist()) == sorted(labels.tolist())


def _write_mnist(folder, **arrays) -> None:
    np.savez(folder / "mnist_test.npz", **arrays)


@pytest.mark.parametrize("case, pattern", [
    ("truncated", "not a readable .npz file"),
    ("random", "not a readable .npz file"),
    ("missing", "no array 'y'"),
    ("shape", r"array 'x' is uint8\[10, 28, 28\], expected uint8\[N, 1, 28, 28\]"),
    ("float", r"array 'x' is float64"),
    ("labels", r"labels in 'y' span 0\.\.12, outside the 10 classes"),
    ("label 10", r"labels in 'y' span 0\.\.10, outside the 10 classes 0\.\.9"),
    ("count", "10 images in 'x' but 9 labels"),
])
def test_damaged_data_files_are_one_message(tmp_path, case: str, pattern: str) -> None:
    x = np.zeros((10, 1, 28, 28), np.uint8)
    y = np.arange(10, dtype=np.uint8) % 10
    if case == "truncated":
        _write_mnist(tmp_path, x=x, y=y)
        data = (tmp_path / "mnist_test.npz").read_bytes()
        (tmp_path / "mnist_test.npz").write_bytes(data[: len(data) // 2])
    elif case == "random":
        (tmp_path / "mnist_test.npz").write_bytes(np.random.default_rng(0).bytes(4096))
    elif case == "missing":
        _write_mnist(tmp_path, x=x)
    elif case == "shape":
        _write_mnist(tmp_path, x=x[:, 0], y=y)
    elif case == "float":
        _write_mnist(tmp_path, x=x.astype(float), y=y)
    elif case == "labels":
        _write_mnist(tmp_path, x=x, y=np.where(y == 3, 12, y).astype(np.uint8))
    elif case == "label 10":
        _write_mnist(tmp_path, x=x, y=np.where(y == 3, 10, y).astype(np.uint8))
    else:
        _write_mnist(tmp_path, x=x, y=y[:9])
    with pytest.raises(InputError, match=pattern):
        load_dataset("mnist-subset", root=tmp_path)


def test_test_split_is_normalised_with_the_training_statistics() -> None:
    d = load_dataset("cifar10-subset")
    raw = np.load(find_data_dir() / "cifar10_subset.npz")
    mean = torch.tensor(d.mean).view(1, 3, 1, 1)
    std = torch.tensor(d.std).view(1, 3, 1, 1)
    # x = (pixel/255 − mean_train)/std_train for both splits: undoing it gives the stored pixels back
    assert torch.allclose((d.x_test * std + mean) * 255, torch.from_numpy(raw["x_test"]).float(), atol=1e-3)
    assert torch.allclose((d.x_train[:500] * std + mean) * 255, torch.from_numpy(raw["x_train"][:500]).float(), atol=1e-3)
    assert not torch.allclose(d.x_test.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-4)    # not re-normalised on its own


class FakeVision:
    """A stand-in for a torchvision dataset class: uint8 images (N, H, W) or (N, H, W, C) and labels, per split."""

    calls: list = []
    fail: Exception | None = None
    channels = None

    def __init__(self, root: str, train: bool, download: bool) -> None:
        FakeVision.calls.append((root, train, download))
        if FakeVision.fail is not None:
            raise FakeVision.fail
        n = 6 if train else 4
        shape = (n, 5, 5) if self.channels is None else (n, 5, 5, self.channels)
        self.data = torch.arange(np.prod(shape), dtype=torch.uint8).reshape(shape) if train else \
            np.full(shape, 7, dtype=np.uint8)
        self.targets = list(range(n))


def test_torchvision_datasets_are_read_channel_first_per_split(tmp_path, monkeypatch) -> None:
    import torchvision

    class Gray(FakeVision):
        pass

    class Colour(FakeVision):
        channels = 3

    monkeypatch.setattr(torchvision.datasets, "MNIST", Gray)
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", Colour)
    FakeVision.calls, FakeVision.fail = [], None
    gray = load_dataset("mnist", root=tmp_path)
    assert FakeVision.calls == [(str(tmp_path), True, False), (str(tmp_path), False, False)]
    assert gray.x_train.shape == (6, 1, 5, 5) and gray.x_test.shape == (4, 1, 5, 5) and gray.input_shape == (1, 5, 5)
    assert gray.y_train.tolist() == list(range(6)) and gray.y_test.tolist() == list(range(4))
    assert gray.name == "mnist" and gray.num_classes == 10
    colour = load_dataset("cifar10", root=tmp_path, download=True)
    assert colour.x_train.shape == (6, 3, 5, 5) and FakeVision.calls[-1] == (str(tmp_path), False, True)
    nested = tmp_path / "new" / "root"                      # a download may name a folder still to be made
    load_dataset("cifar10", root=nested, download=True)
    assert nested.is_dir() and FakeVision.calls[-1] == (str(nested), False, True)
    with pytest.raises(InputError, match="is not a directory"):
        load_dataset("cifar10", root=tmp_path / "absent")     # without --download it must exist
    # (N, H, W, C) → (N, C, H, W): pixel (0, 0) of channel 1 is the second byte of the stored image
    pixels = colour.x_train * torch.tensor(colour.std).view(1, 3, 1, 1) + torch.tensor(colour.mean).view(1, 3, 1, 1)
    assert float(pixels[0, 1, 0, 0]) * 255 == pytest.approx(1.0, abs=1e-3)
    FakeVision.fail = RuntimeError("Dataset not found or corrupted.")
    with pytest.raises(InputError, match="add --download to fetch them"):
        load_dataset("cifar10", root=tmp_path)
    with pytest.raises(InputError, match="check the network or download the files yourself"):
        load_dataset("cifar10", root=tmp_path, download=True)
    FakeVision.fail = None


def test_images_of_the_right_rank_but_the_wrong_size_are_refused(tmp_path) -> None:
    _write_mnist(tmp_path, x=np.zeros((10, 1, 32, 28), np.uint8), y=np.arange(10, dtype=np.uint8))
    with pytest.raises(InputError, match=r"array 'x' is uint8\[10, 1, 32, 28\], expected uint8\[N, 1, 28, 28\]") as info:
        load_dataset("mnist-subset", root=tmp_path)
    assert info.value.field == "--data-root"
