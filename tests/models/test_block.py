"""Block: built through the positional registry, causal (decoder) or not (encoder)."""

import itertools

import pytest
import torch

from spe import ATTENTIONS, DecoderLM, ModelConfig
from spe.encodings.registry import POSITIONAL_SPECS, positional_spec
from spe.attention.layer import POSITIONAL_ROLES
from spe.models.block import Block


def _config(positional, attention):
    return ModelConfig(vocab_size=20, d_model=32, num_layers=1, num_heads=2, d_ff=64, dropout=0.0,
                       positional=positional, attention=attention, num_realizations=8, num_sines=2,
                       kernel_size=6, num_features=16, chunk_size=4, max_distance=6, max_positions=64)


def _valid(positional, attention):
    try:
        _config(positional, attention)
    except ValueError:
        return False
    return True


PAIRS = [(p, a) for p, a in itertools.product(POSITIONAL_SPECS, ATTENTIONS) if _valid(p, a)]


def _inputs(config, block=None, n=23):
    spec = positional_spec(config.positional)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, n, config.d_model, generator=g)
    positions = torch.arange(n)
    module = spec.build_model_module(config)
    if spec.acts_on == "tokens":
        x = module(x, positions)
    code = module(positions=positions, generator=torch.Generator().manual_seed(1)) if spec.stochastic else None
    if spec.acts_on == "scores" and module is not None:  # an SPE oracle reads the model's SPE kernel
        block.attn.score_encoding.bind(module)
    return x, code, (None if spec.acts_on == "scores" else positions)


@pytest.mark.parametrize("positional,attention", PAIRS)
@pytest.mark.parametrize("causal", [True, False])
def test_a_future_change_reaches_position_m_only_without_causality(positional, attention, causal):
    config = _config(positional, attention)
    torch.manual_seed(0)
    if not causal and POSITIONAL_SPECS[positional].causal_only:  # PaTH: no encoder form, refused
        with pytest.raises(ValueError, match="causal"):
            Block(config, causal=False)
        return
    block = Block(config, causal=causal).eval()
    x, code, positions = _inputs(config, block)
    changed = x.clone()
    changed[:, 15:] += torch.randn(2, 8, config.d_model, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a, b = block(x, code, positions), block(changed, code, positions)
    before = (a[:, :15] - b[:, :15]).abs().max()
    if causal:
        assert before < 1e-5
    else:
        assert before > 1e-4  # every earlier position sees the change
    assert (a[:, 15:] - b[:, 15:]).abs().max() > 1e-4


@pytest.mark.parametrize("positional", [n for n, s in POSITIONAL_SPECS.items() if not s.needs_grid])
def test_the_registry_decides_which_module_goes_where(positional):
    spec = positional_spec(positional)
    attention = "softmax" if spec.acts_on == "scores" else "performer"
    config = _config(positional, attention)
    model = DecoderLM(config)
    attn = model.blocks[0].attn
    # where the layer keeps its module follows from where the encoding acts (and whether it is SPE)
    expected = {("queries-keys", True): "spe_filter", ("queries-keys", False): "rotary",
                ("scores", False): "score_encoding", ("features", False): "feature_transform"}.get(
        (spec.acts_on, spec.stochastic))
    for role in POSITIONAL_ROLES:
        assert (getattr(attn, role) is not None) == (role == expected), role
    assert (model.ape is not None) == (spec.acts_on == "tokens")
    # SPE code generators, and the SPE module an oracle's score terms read (sinespe-exact)
    assert (model.encoding is not None) == (spec.stochastic or (spec.acts_on == "scores" and
                                                                spec.model_module is not None))
    assert model.embed_scale == (config.d_model ** 0.5 if spec.scale_embeddings else 1.0)


def test_a_non_causal_block_refuses_a_window():
    config = _config("sinespe", "performer")
    config.attention_window = 8
    with pytest.raises(ValueError, match="causal"):
        Block(config, causal=False)


def test_models_attention_and_capture_name_no_positional_encoding():
    # Choices go through the registry: no string constant (docstrings aside) in these modules
    # is a registered name, so adding an encoding touches the registry only.
    import ast
    from pathlib import Path

    import spe

    root = Path(spe.__file__).parent
    for rel in ("models/block.py", "models/decoder_lm.py", "attention/layer.py", "lab/metrics/capture.py"):
        tree = ast.parse((root / rel).read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                      and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        names = {n.value for n in ast.walk(tree)
                 if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings}
        assert not names & set(POSITIONAL_SPECS), (rel, names & set(POSITIONAL_SPECS))
