"""A training process's CPU set-up (trainers/config/host.py): torch's threads and glibc's kept heap."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest
import torch

from trainers.config import host


class FakeLibc:
    """Stands in for ``ctypes.CDLL(None)``: records each ``mallopt(param, value)`` and answers ``answer``."""

    def __init__(self, answer: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []

        def mallopt(param: int, value: int) -> int:
            self.calls.append((param, value))
            return answer

        self.mallopt = mallopt


def _glibc(monkeypatch, libc: FakeLibc, name: str = "glibc") -> None:
    monkeypatch.setattr(host.platform, "libc_ver", lambda *a, **k: (name, "2.36" if name else ""))
    monkeypatch.setattr(host.ctypes, "CDLL", lambda path: libc)
    monkeypatch.delenv(host.KEEP_HEAP_ENV, raising=False)


def test_the_heap_is_kept_by_glibcs_mmap_threshold_trim_threshold_and_top_pad(monkeypatch) -> None:
    libc = FakeLibc()
    _glibc(monkeypatch, libc)
    assert host.keep_freed_memory() is True
    # malloc.h: M_MMAP_THRESHOLD = -3 (glibc's 64-bit maximum, 32 MiB), M_TRIM_THRESHOLD = -1 (1 GiB kept at the
    # top), M_TOP_PAD = -2 (the heap grown 256 MiB at a time)
    assert libc.calls == [(-3, 32 << 20), (-1, 1 << 30), (-2, 1 << 28)]


@pytest.mark.parametrize("case", ["opted out", "not glibc", "glibc refuses"])
def test_the_heap_is_left_alone_where_it_cannot_or_should_not_be_kept(monkeypatch, case: str) -> None:
    libc = FakeLibc(answer=0 if case == "glibc refuses" else 1)
    _glibc(monkeypatch, libc, name="" if case == "not glibc" else "glibc")
    if case == "opted out":
        monkeypatch.setenv("ADAPTPLAN_KEEP_HEAP", "0")
    assert host.keep_freed_memory() is False
    assert libc.calls == ([] if case != "glibc refuses" else [(-3, 32 << 20)])


def test_use_cpu_sets_the_threads_asked_for_and_keeps_the_heap(monkeypatch) -> None:
    threads: list[int] = []
    kept: list[bool] = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    monkeypatch.setattr(host, "keep_freed_memory", lambda: kept.append(True) or True)
    host.use_cpu(3)
    host.use_cpu(None)                  # torch's default: the threads are not touched
    host.use_cpu(0)
    assert threads == [3]
    assert kept == [True, True, True]


STEPS = textwrap.dedent("""
    import resource, sys, torch
    from trainers.config.host import use_cpu
    from trainers.inputs.models import leaf_lstm
    use_cpu(1)
    torch.manual_seed(0)
    model = leaf_lstm(80)
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    x, y = torch.randint(0, 80, (32, 80)), torch.randint(0, 80, (32,))
    def step():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()
    for _ in range(2):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    losses = [step() for _ in range(4)]
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, *losses)
""")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")
def test_a_kept_heap_stops_the_page_faults_of_a_training_step_and_trains_alike() -> None:
    def run(keep: str) -> tuple[int, list[str]]:
        done = subprocess.run([sys.executable, "-c", STEPS], env={"ADAPTPLAN_KEEP_HEAP": keep, "PATH": ""},
                              capture_output=True, text=True, check=True)
        faults, *losses = done.stdout.split()
        return int(faults), losses

    default_faults, default_losses = run("0")
    kept_faults, kept_losses = run("1")
    # glibc's defaults hand the LSTM's freed workspaces back and fault them in again: thousands of pages a step
    assert default_faults > 4 * 1000
    assert kept_faults * 4 < default_faults
    assert kept_losses == default_losses            # where buffers live changes nothing they hold
