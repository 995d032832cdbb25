"""How a training process uses its CPU: torch's intra-op threads and glibc's heap, set in one place.

Every process that trains (``adaptplan train``, each rank of a distributed run, each worker of a benchmark) calls
:func:`use_cpu` once before its first step.

**The heap.** A training step allocates and frees the same large buffers again and again (oneDNN's RNN
workspaces, autograd's saved activations, optimizer temporaries). glibc's malloc hands freed memory at the top of
its heap back to the kernel once it exceeds its trim threshold (and serves big requests with fresh ``mmap``), so
the next step touches new pages: on the LEAF LSTM (batch 32, one thread) about 13,000 page faults a step, 14–18 %
of the training loop's CPU time spent in the kernel clearing pages. :func:`keep_freed_memory` (glibc's ``mallopt``,
malloc.h) serves blocks of up to 32 MiB from the heap (the most glibc's own rule ever would, fixed so that it does
not depend on what the process freed before) and raises the trim threshold and the heap's top pad, so that freed
memory stays with the process for the next step; the process then holds on to its peak heap, which it reaches
every step anyway. The numbers train bit for bit alike (the allocator decides where buffers live, never their
contents); ``benchmarks/allocator_ab.py`` measures faults and speed side by side. ``ADAPTPLAN_KEEP_HEAP=0``
leaves glibc's defaults; off glibc (macOS, musl) nothing changes.
"""

from __future__ import annotations

import ctypes
import os
import platform

import torch

#: ``mallopt`` parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
#: Blocks below this come from the heap, larger ones are mapped (bytes): glibc's maximum on 64-bit (HEAP_MAX_SIZE / 2).
MMAP_THRESHOLD_BYTES = 1 << 25
#: Free memory at the heap's top kept before glibc trims it (bytes): above any step's working set.
TRIM_THRESHOLD_BYTES = 1 << 30
#: Extra bytes glibc asks of the kernel each time the heap grows (address space; pages are touched only when used).
TOP_PAD_BYTES = 1 << 28
#: Set to ``0`` to leave glibc's allocator at its defaults.
KEEP_HEAP_ENV = "ADAPTPLAN_KEEP_HEAP"


def keep_freed_memory() -> bool:
    """Keep freed heap memory in this process (glibc ``mallopt``: M_MMAP_THRESHOLD = :data:`MMAP_THRESHOLD_BYTES`,
    M_TRIM_THRESHOLD = :data:`TRIM_THRESHOLD_BYTES`, M_TOP_PAD = :data:`TOP_PAD_BYTES`); True where glibc took all
    three, False off glibc or with ``ADAPTPLAN_KEEP_HEAP=0``. Process-wide and not undone."""
    if os.environ.get(KEEP_HEAP_ENV, "1") == "0" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) for param, value in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
                                                           (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
                                                           (M_TOP_PAD, TOP_PAD_BYTES)))


def use_cpu(threads: int | None) -> None:
    """Set torch's intra-op threads to ``threads`` (None or 0: torch's default) and keep freed heap memory
    (:func:`keep_freed_memory`)."""
    if threads:
        torch.set_num_threads(threads)
    keep_freed_memory()
