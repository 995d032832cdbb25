"""Data sets the tests read where a system package installs them, and the mark that skips a test without them."""

from __future__ import annotations

import pytest

from trainers.inputs.datasets import DEBIAN_FASHION_MNIST, FASHION_MNIST_FILES

FASHION_MNIST_INSTALLED = all((DEBIAN_FASHION_MNIST / f).is_file() for f in FASHION_MNIST_FILES)
needs_fashion_mnist = pytest.mark.skipif(
    not FASHION_MNIST_INSTALLED,
    reason="Debian's dataset-fashion-mnist is not installed (apt-get install dataset-fashion-mnist; .ci/run installs it)")
