"""A resume compares the data, not only its path: pieces added, removed, edited or moved between
the splits are refused by name (or, with allow_data_change, continued with a warning)."""

import json
import re
import warnings

import numpy as np
import pytest
import torch
from conftest import write_midi
from tiny_run import tiny_config, toml_text

from spe.checkpoint import load_metadata
from spe.lab.cli.main import main
from spe.lab.music.train import train
from spe.lab.engine.data_check import data_record
from spe.lab.music.status import RunStatus, check_resume


def _pieces(*lengths):
    return [np.arange(n, dtype=np.int64) for n in lengths]


def test_the_record_follows_the_pieces_and_the_split_not_the_objects():
    record = data_record(train=_pieces(3, 4), validation=_pieces(5))
    assert record == data_record(train=_pieces(3, 4), validation=_pieces(5))
    assert record["train"]["count"] == 2 and record["validation"]["count"] == 1
    assert data_record(train=[torch.arange(3), torch.arange(4)], validation=_pieces(5)) == record  # CPU tensors
    moved = data_record(train=_pieces(3, 5), validation=_pieces(4))  # same pieces, other split
    assert moved["train"]["digest"] != record["train"]["digest"]
    edited = _pieces(3, 4)
    edited[1][2] = 9
    assert data_record(train=edited, validation=_pieces(5))["train"]["digest"] != record["train"]["digest"]


def _status(tmp_path, **metadata):
    return RunStatus("resume", tmp_path / "run", 6, metadata={"train": {"data": "corpus"}, **metadata})


def test_what_changed_is_named_and_older_checkpoints_are_compared_on_what_they_recorded(tmp_path):
    before = data_record(train=_pieces(3, 4), validation=_pieces(5))
    grown = data_record(train=_pieces(3, 4, 6), validation=_pieces(5))
    edited = data_record(train=_pieces(3, 4), validation=_pieces(7))
    check_resume(_status(tmp_path, data=before), "", before)
    with pytest.raises(ValueError, match=r"^--resume: .*corpus.*\(train pieces 2 -> 3\).*--out.*--allow-data-change"):
        check_resume(_status(tmp_path, data=before), "", grown)
    with pytest.raises(ValueError, match=r"\(validation pieces: the same number \(1\), other contents\)"):
        check_resume(_status(tmp_path, data=before), "", edited)
    with pytest.warns(UserWarning, match=r"\(train pieces 2 -> 3\); continuing on the new data"):
        check_resume(_status(tmp_path, data=before), "", grown, allow_data_change=True)
    # an older spe recorded the counts only: compared on them; an even older one nothing
    with pytest.raises(ValueError, match=r"\(train pieces 2 -> 3\)"):
        check_resume(_status(tmp_path, num_train_pieces=2, num_val_pieces=1), "", grown)
    check_resume(_status(tmp_path, num_train_pieces=2, num_val_pieces=1), "", edited)
    check_resume(_status(tmp_path), "", grown)


@pytest.mark.slow
def test_spe_train_resume_on_a_grown_data_folder_is_refused_and_allowed_only_when_asked(tmp_path, capsys):
    cfg = tiny_config(tmp_path, "run")
    train(cfg, progress=False)
    run, data = tmp_path / "run", tmp_path / "clean_midi"
    started = load_metadata(run)["data"]
    assert (started["train"]["count"], started["validation"]["count"]) == (5, 1)
    (tmp_path / "run.toml").write_text(toml_text(cfg).replace("steps = 6", "steps = 8"))
    for i in range(6):  # pieces added to the folder after the run started
        write_midi(data / f"added{i}.mid", seed=10 + i, notes=60 + 10 * i)
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}

    assert main(["train", "--config", str(tmp_path / "run.toml"), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"spe train: error: --resume: the data in {re.escape(str(data))} changed since the run "
                        r"started \(train pieces 5 -> 11(, validation pieces: the same number \(1\), other "
                        r"contents)?\): restore it, train into another --out, or pass --allow-data-change to "
                        rf"continue {re.escape(str(run))} on the new split\n", err), err
    assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before

    cfg.steps, cfg.allow_data_change = 8, True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(cfg, resume=True, progress=False)
    assert any("train pieces 5 -> 11" in str(w.message) and "continuing on the new data" in str(w.message)
               for w in caught)
    now = load_metadata(run)
    assert now["step"] == 8 and now["data"]["train"]["count"] == 11
    records = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records == list(range(1, 9))


def _lra_splits():
    from spe.lab.lra.data.dataset import SequenceDataset

    def dataset(n, seed):
        g = torch.Generator().manual_seed(seed)
        return SequenceDataset(torch.randint(2, 19, (n, 10), generator=g), torch.full((n,), 10),
                               torch.randint(0, 10, (n,), generator=g), vocab_size=19, num_classes=10)

    return {"train": dataset(16, 0), "val": dataset(8, 1), "test": dataset(8, 2)}


def test_an_lra_seed_resumed_on_other_splits_is_refused_and_allowed_only_when_asked(tmp_path):
    from spe.lab.lra import LRAConfig
    from spe.lab.lra.train import RESULT_FILE, train_seed

    def cfg(**options):
        return LRAConfig(task="listops", positional="ape", attention="performer", steps=2, batch_size=4,
                         eval_every=2, eval_batch_size=8, model={"d_model": 16, "num_heads": 2, "num_layers": 1,
                                                                 "d_ff": 16, "num_features": 8}, **options)

    folder = tmp_path / "seed0"
    train_seed(cfg(), _lra_splits(), 0, folder, progress=False)
    (folder / RESULT_FILE).unlink()  # as if killed before the test evaluation
    changed = _lra_splits()
    val = changed["val"]
    changed["val"] = type(val)(val.tokens, val.lengths, (val.labels + 1) % 10, val.vocab_size, val.num_classes)
    with pytest.raises(ValueError, match=rf"^--resume: .*{re.escape(str(folder))}.*\(val examples: the same number \(8\), other contents\)"
                                         rf".*delete {re.escape(str(folder))}"):
        train_seed(cfg(), changed, 0, folder, progress=False)
    assert not (folder / RESULT_FILE).exists()
    with pytest.warns(UserWarning, match=r"\(val examples: the same number \(8\), other contents\); continuing"):
        train_seed(cfg(allow_data_change=True), changed, 0, folder, progress=False)
    assert (folder / RESULT_FILE).is_file()
