"""Datasets behind one option ``--dataset NAME [--data-root DIR]`` (never downloads).

* ``cifar10-subset``: 5,085 train / 1,017 test genuine CIFAR-10 images from
  ``shared/data/cifar10_subset.npz`` (see shared/data/README.md).
* ``mnist-subset``: the official MNIST test set (``shared/data/mnist_test.npz``) split 8,000 / 2,000
  with a fixed seed (:data:`MNIST_SPLIT_SEED`).
* ``cifar10``, ``cifar100``, ``mnist``, ``fashion-mnist``: torchvision datasets read from a
  user-given ``root`` with ``download=False``. ``mnist`` without ``--data-root`` falls back to
  ``mnist-subset``.
* ``synthetic``: generated, no files — learnable Gaussian class clusters of shape 1×8×8, 10
  classes, 2,000 train / 400 test samples (fixed seed :data:`SYNTHETIC_SEED`); for fast tests.

Tensors: ``x`` float32 (N, C, H, W), pixel values scaled to [0, 1] and then normalised per
channel with the **training split's** mean and standard deviation (``synthetic`` is generated
already centred and is not re-normalised); ``y`` int64 class indices.

torch is imported only when a dataset is loaded, so :func:`dataset_names` (used by
``trainers.config`` and the CLI parser) stays torch-free.

The shared data directory is, in order: ``$ADAPTPLAN_DATA_DIR``; else the first
``shared/data`` found in the current directory, the repository checkout or any of their parents.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from adaptplan.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    import torch

MNIST_SPLIT_SEED = 0
MNIST_TRAIN_SIZE = 8000
SYNTHETIC_SEED = 1234
DATA_ENV = "ADAPTPLAN_DATA_DIR"


@dataclass(frozen=True)
class Dataset:
    """A train/test pair of normalised tensors.

    Attributes:
        x_train, x_test: float32 (N, C, H, W), normalised per channel.
        y_train, y_test: int64 (N,) class indices 0..num_classes−1.
        num_classes: number of classes.
        input_shape: per-sample shape (C, H, W).
        name: the dataset actually loaded (``mnist`` without a root loads ``mnist-subset``).
        mean, std: per-channel statistics used for normalisation (of [0, 1] pixels).
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    name: str
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()


def find_data_dir(start: Path | None = None) -> Path:
    """The shared data directory (module docstring); InputError if none is found."""
    env = os.environ.get(DATA_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise InputError(f"${DATA_ENV} is {env!r}, which is not a directory", field=DATA_ENV)
        return path
    roots = [start] if start else [Path.cwd(), Path(__file__).resolve().parent.parent]
    for root in roots:
        for folder in (root.resolve(), *root.resolve().parents):
            candidate = folder / "shared" / "data"
            if candidate.is_dir():
                return candidate
    raise InputError(f"no shared/data directory found above {', '.join(str(r) for r in roots)}; "
                     f"set ${DATA_ENV} or pass --data-root", field="--data-root")


def _normalise(x_train: torch.Tensor, x_test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple, tuple]:
    dims = [0, *range(2, x_train.dim())]
    mean = x_train.mean(dim=dims, keepdim=True)
    std = x_train.std(dim=dims, keepdim=True).clamp_min(1e-8)
    return (x_train - mean) / std, (x_test - mean) / std, tuple(mean.flatten().tolist()), tuple(std.flatten().tolist())


def _make(name: str, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
          num_classes: int) -> Dataset:
    """uint8 (N, C, H, W) arrays → normalised float tensors."""
    import torch

    xtr = torch.from_numpy(np.ascontiguousarray(x_train)).float().div(255)
    xte = torch.from_numpy(np.ascontiguousarray(x_test)).float().div(255)
    xtr, xte, mean, std = _normalise(xtr, xte)
    return Dataset(x_train=xtr, y_train=torch.from_numpy(np.asarray(y_train)).long(), x_test=xte,
                   y_test=torch.from_numpy(np.asarray(y_test)).long(), num_classes=num_classes,
                   input_shape=tuple(xtr.shape[1:]), name=name, mean=mean, std=std)


def _npz(root: Path | None, filename: str) -> np.lib.npyio.NpzFile:
    folder = Path(root) if root else find_data_dir()
    path = folder / filename
    if not path.is_file():
        raise InputError(f"{filename} not found in {str(folder)!r}; pass the directory holding it with --data-root "
                         f"or set ${DATA_ENV}", field="--data-root")
    return np.load(path)


def _cifar10_subset(root: Path | None) -> Dataset:
    d = _npz(root, "cifar10_subset.npz")
    return _make("cifar10-subset", d["x_train"], d["y_train"], d["x_test"], d["y_test"], 10)


def _mnist_subset(root: Path | None) -> Dataset:
    d = _npz(root, "mnist_test.npz")
    x, y = d["x"], d["y"]
    order = np.random.default_rng(MNIST_SPLIT_SEED).permutation(len(x))
    train, test = order[:MNIST_TRAIN_SIZE], order[MNIST_TRAIN_SIZE:]
    return _make("mnist-subset", x[train], y[train], x[test], y[test], 10)


def _torchvision(class_name: str, name: str, num_classes: int) -> Callable[[Path | None], Dataset]:
    def load(root: Path | None) -> Dataset:
        if root is None:
            raise InputError(f"dataset {name!r} is read from torchvision files; pass --data-root DIR "
                             "(files are never downloaded)", field="--data-root")
        import torch
        import torchvision

        cls = getattr(torchvision.datasets, class_name)
        try:
            train, test = (cls(root=str(root), train=flag, download=False) for flag in (True, False))
        except RuntimeError as exc:  # torchvision: "Dataset not found or corrupted..."
            raise InputError(f"{name} not found under {str(root)!r} ({exc}); download it yourself "
                             "or fix --data-root", field="--data-root") from None
        arrays = []
        for part in (train, test):
            data = part.data.numpy() if isinstance(part.data, torch.Tensor) else np.asarray(part.data)
            data = data[:, None] if data.ndim == 3 else data.transpose(0, 3, 1, 2)  # → (N, C, H, W)
            arrays += [data, np.asarray(part.targets)]
        return _make(name, *arrays, num_classes)
    return load


def _mnist(root: Path | None) -> Dataset:
    return _torchvision("MNIST", "mnist", 10)(root) if root is not None else _mnist_subset(None)


def _synthetic(root: Path | None) -> Dataset:
    """Learnable Gaussian class clusters (module docstring); ``root`` is ignored (no files)."""
    import torch

    n_train, n_test, classes = 2000, 400, 10
    g = torch.Generator().manual_seed(SYNTHETIC_SEED)
    centers = torch.randn(classes, 1, 8, 8, generator=g)
    y = torch.randint(0, classes, (n_train + n_test,), generator=g)
    x = centers[y] + 0.8 * torch.randn(n_train + n_test, 1, 8, 8, generator=g)
    return Dataset(x_train=x[:n_train], y_train=y[:n_train], x_test=x[n_train:], y_test=y[n_train:],
                   num_classes=classes, input_shape=(1, 8, 8), name="synthetic")


LOADERS: dict[str, Callable[[Path | None], Dataset]] = {
    "cifar10-subset": _cifar10_subset,
    "mnist-subset": _mnist_subset,
    "mnist": _mnist,
    "cifar10": _torchvision("CIFAR10", "cifar10", 10),
    "cifar100": _torchvision("CIFAR100", "cifar100", 100),
    "fashion-mnist": _torchvision("FashionMNIST", "fashion-mnist", 10),
    "synthetic": _synthetic,
}


def dataset_names() -> list[str]:
    """Valid values of ``--dataset``."""
    return list(LOADERS)


def load_dataset(name: str, root: str | os.PathLike | None = None) -> Dataset:
    """Load dataset ``name`` (see :func:`dataset_names`) from ``root`` or the shared data directory.

    Raises:
        InputError: unknown name (valid names listed) or missing files; nothing is downloaded.
    """
    loader = LOADERS.get(name)
    if loader is None:
        raise InputError(f"unknown dataset {name!r}; valid: {', '.join(LOADERS)}", field="--dataset")
    folder = Path(root).expanduser() if root is not None else None
    if folder is not None and not folder.is_dir():
        raise InputError(f"{str(folder)!r} is not a directory", field="--data-root")
    return loader(folder)
