import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

torch.set_num_threads(min(2, torch.get_num_threads()))


class LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an operation returns while active (``largest``): a
    kernel said to form no L x L tensor, forward or backward, is checked with it."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def write_midi(path, *, notes=60, seed=0, program=0):
    """A small random monophonic MIDI file (quarter-note grid), via symusic."""
    import random

    from symusic import Note, Score, Track

    rng = random.Random(seed)
    score = Score(480)
    track = Track(program=program)
    for i in range(notes):
        track.notes.append(Note(i * 240, 240, rng.randint(55, 75), 80))
    score.tracks.append(track)
    path.parent.mkdir(parents=True, exist_ok=True)
    score.dump_midi(str(path))
    return path


@pytest.fixture
def midi_folder(tmp_path):
    root = tmp_path / "midi"
    for i in range(6):
        write_midi(root / f"piece{i}.mid", seed=i, notes=60 + 10 * i)
    write_midi(root / "sub" / "UPPER.MIDI", seed=9)
    (root / "broken.mid").write_bytes(b"MThd\x00\x00\x00\x06this is not a midi file")
    (root / "notes.txt").write_text("not music")
    return root


@pytest.fixture(autouse=True)
def _timed_compile_off():
    # `spe train --compile` in a test turns the timed sineSPE product's compile on for the
    # process: later tests run it eagerly again (a compile costs seconds)
    from spe.ops.sine import timed

    saved = dict(timed.COMPILE)
    yield
    timed.COMPILE.clear()
    timed.COMPILE.update(saved)


def load_tool(relative_path: str, name: str):
    """A script of tools/ (not a package) imported as module ``name``."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / relative_path
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shifted_to_p(row, best, p):
    """``row`` moved by a constant (its spread kept) so that its one-sided Welch p-value against
    ``best`` (cross-entropy: "row is worse") is exactly ``p``: rows placed on either side of a
    threshold of the study's rules (spe.lab.study_rules)."""
    from spe.lab.study_rules import flip_mean

    target = flip_mean(row, best, "cross_entropy", alpha=p)
    return [x - sum(row) / len(row) + target for x in row]
