"""feature_redraw_every: an LRA run redraws its FAVOR+ projections on schedule, from its own stream.

The ListOps study's control (APE + Performer with features redrawn at every step) rests on these runs
really redrawing, and on runs without the option keeping the generators they always had.
"""

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import lra_splits, tiny_lra_config

from spe.lab.lra import preset_config
from spe.lab.lra.run import default_folder
from spe.lab.lra.task import LRATask
from spe.lab.lra.train import train_seed



def _projections(folder):
    weights = load_file(str(folder / "last" / "model.safetensors"))
    return {k: v for k, v in weights.items() if k.endswith("projection")}


def test_only_runs_with_redraws_get_a_feature_stream():
    assert LRATask(tiny_lra_config(), {}).generators == ("data", "code")
    assert LRATask(tiny_lra_config(feature_redraw_every=1), {}).generators == ("data", "code", "feature")


@pytest.mark.slow
def test_redrawn_every_step_the_projections_change_and_never_otherwise(tmp_path):
    """The projections are buffers (no gradient): only a redraw moves them, and one at step 3 is
    not the draw of initialisation, while weights, data and codes see the same streams."""
    splits = lra_splits()
    for name, every in (("never", 0), ("every", 1)):
        torch.manual_seed(0)
        train_seed(tiny_lra_config(steps=3, eval_every=3, attention="performer", feature_redraw_every=every),
                   splits, 0, tmp_path / name, progress=False)
    never, every = _projections(tmp_path / "never"), _projections(tmp_path / "every")
    assert never and never.keys() == every.keys()
    from spe.lab.lra import build_classifier
    torch.manual_seed(0)
    initial = {k: v for k, v in build_classifier(tiny_lra_config(), splits["train"]).state_dict().items()
               if k.endswith("projection")}
    for key in never:
        assert torch.equal(never[key], initial[key])  # seed 0's initialisation, untouched
        assert not torch.allclose(every[key], initial[key])
        # still FAVOR+'s orthogonal blocks: rows of one block orthogonal to each other
        block = every[key][0, : every[key].shape[-1]]
        gram = block @ block.T
        torch.testing.assert_close(gram - torch.diag(torch.diagonal(gram)), torch.zeros_like(gram),
                                   atol=1e-4, rtol=0)


def test_the_option_names_its_folder_and_bad_values_are_refused():
    cfg = preset_config("listops", "ape", "performer", feature_redraw_every=1)
    assert default_folder(cfg).name == "listops-performer-ape-feature_redraw_every-1"
    assert default_folder(preset_config("listops", "ape", "performer")).name == "listops-performer-ape"
    with pytest.raises(ValueError, match="feature_redraw_every must be an integer ≥ 0.*got -1"):
        preset_config("listops", "ape", "performer", feature_redraw_every=-1)
    for value in (1.5, True, "2"):  # wrong types: the one type checker (spe.field_types) names them
        with pytest.raises(ValueError, match=f"LRA option feature_redraw_every must be an integer, got {value!r}"):
            preset_config("listops", "ape", "performer", feature_redraw_every=value)
