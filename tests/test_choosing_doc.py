"""docs/choosing.md is the one recommendation: every flag set it (and the README's short table)
gives parses with the command's own parser and builds a model that runs causally, and the
README's rows are the page's, so that the two cannot drift apart."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch

import spe
from spe.lab.cli.main import build_parser
from spe.lab.cli.model_flags import model_flag_options
from spe.lab.music.config import resolve_model_options

ROOT = Path(__file__).resolve().parents[1]
CHOOSING = (ROOT / "docs" / "choosing.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _flag_sets(text: str) -> list[str]:
    """Every code span that is a set of model flags (it starts with --positional)."""
    return [span.strip() for span in re.findall(r"`((?:spe lra )?--positional [^`]+)`", text)]


def _bash_train_lines(text: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    return [line for block in blocks for line in block.splitlines() if line.startswith("spe train ")]


CHOOSING_SETS = _flag_sets(CHOOSING)
README_SETS = _flag_sets(README.split("## Which to use", 1)[1].split("\n## ", 1)[0])


def test_the_page_and_the_readme_give_flag_sets():
    # the situations of the page: far beyond L, in range (twice), linear, SPE up to 3 L, recall, encoders
    assert len(CHOOSING_SETS) >= 7, CHOOSING_SETS
    assert len(README_SETS) >= 4, README_SETS


def test_every_readme_recommendation_is_the_pages():
    page = {" ".join(s.replace("spe lra ", "").split()) for s in CHOOSING_SETS}
    for flags in README_SETS:
        assert " ".join(flags.split()) in page, f"README recommends {flags!r}, which docs/choosing.md does not"


def _model_options(command: str, flags: str) -> dict:
    args = build_parser().parse_args([command, *shlex.split(flags)])
    return args, model_flag_options(args)


@pytest.mark.parametrize("flags", sorted(set(CHOOSING_SETS + README_SETS)))
def test_each_recommended_flag_set_builds_a_causal_model(flags):
    command = "lra" if flags.startswith("spe lra ") else "train"
    args, options = _model_options(command, flags.removeprefix("spe lra "))
    # what was asked is what the model gets (a flag dropped on the way would leave a default)
    for name in ("positional", "attention", "decay"):
        if getattr(args, name, None) is not None:
            assert options[name] == getattr(args, name)
    if command == "lra":
        return  # the encoder's flags are checked by spe lra's own tests; parsing is what this page adds
    config = spe.ModelConfig(vocab_size=40, d_model=32, num_layers=1, num_heads=2,
                             **resolve_model_options(options, seq_len=16))
    for name, value in options.items():
        assert getattr(config, name) == value, name
    model = spe.DecoderLM(config).eval()
    torch.manual_seed(0)
    tokens = torch.randint(0, 40, (1, 24))
    with torch.no_grad():
        full = model(tokens)
        changed = tokens.clone()
        changed[:, 12:] = (changed[:, 12:] + 1) % 40
        prefix = model(changed)
    # causal: the future never reaches the first 12 positions' logits
    assert torch.isfinite(full).all()
    assert torch.allclose(full[:, :12], prefix[:, :12], atol=1e-5)


def test_the_pages_train_lines_parse():
    lines = [line.rstrip("\\").strip() for line in _bash_train_lines(CHOOSING) + _bash_train_lines(README)]
    assert len(lines) >= 4
    parser = build_parser()
    for line in lines:
        parser.parse_args(shlex.split(line)[1:])
