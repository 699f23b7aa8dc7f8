"""cls_attention: the CLS weights it draws are the ones the layer applies, padding aside."""

import pytest
import torch

from spe.lab.lra.attention import cls_attention
from spe.models import ClassifierConfig, EncoderClassifier


def _model(positional, attention, seed=0, decay="none"):
    torch.manual_seed(seed)
    config = ClassifierConfig(vocab_size=12, d_model=16, num_layers=2, num_heads=2, d_ff=32, dropout=0.0,
                              positional=positional, attention=attention, num_realizations=8, num_sines=2,
                              kernel_size=5, num_features=16, max_positions=64, num_classes=3, pooling="cls",
                              decay=decay)
    return EncoderClassifier(config).double().eval()


def _layer_io(model, tokens, lengths):
    """The last layer's input and output in one forward pass."""
    seen = {}

    def hook(module, args, kwargs, output):
        seen["x"], seen["code"], seen["y"] = args[0], args[1] if len(args) > 1 else kwargs.get("code"), output

    handle = model.blocks[-1].attn.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model.encode(tokens, lengths)
    finally:
        handle.remove()
    return seen


# RoPE with a linear kernel rotates only the numerator's features: its weights are the
# normaliser's, which the output does not combine the values with, so it is left out here.
@pytest.mark.parametrize("positional,attention,decay", [
    ("ape", "softmax", "none"), ("rope", "softmax", "none"), ("sinespe", "softmax", "none"),
    ("ape", "performer", "none"), ("sinespe", "performer", "none"), ("convspe", "linear-relu", "none"),
    ("none", "linear-elu", "none"), ("sinespe", "performer", "fixed"), ("none", "linear-elu", "learned"),
    ("permute", "linear-relu", "fixed")])
def test_the_weights_combine_the_values_into_the_layers_own_cls_output(positional, attention, decay):
    model = _model(positional, attention, decay=decay)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(12, (3, 9), generator=gen)
    lengths = torch.tensor([9, 5, 2])
    weights = cls_attention(model, tokens, lengths)  # (B, H, L)
    attn, seen = model.blocks[-1].attn, _layer_io(model, tokens, lengths)
    _, _, v = attn.project(seen["x"], seen["code"])  # (B, L, H, D)
    mixed = torch.einsum("bhl,blhd->bhd", weights.double(), v)
    expected = attn.out(mixed.reshape(len(tokens), -1))
    # cls_attention forms its weights in float32 (unit roundoff 2⁻²⁴ ≈ 6e-8); the output sums
    # L·D such rounded products, so its error stays below ~1e-6 of the output's scale.
    scale = float(seen["y"][:, 0].abs().max())
    torch.testing.assert_close(seen["y"][:, 0], expected, rtol=0, atol=1e-6 * scale)
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)), rtol=0, atol=1e-6)
    padding = torch.arange(10)[None] > lengths[:, None]  # CLS + 9 tokens
    assert torch.all(weights.masked_select(padding[:, None]) == 0)


def test_huge_favor_key_norms_do_not_let_padding_become_the_common_scale():
    """Keys of norm ~10³ have FAVOR+ log scales near −10⁶, far below any finite padding sentinel:
    the padded example must still give the weights of the same tokens unpadded."""
    model = _model("ape", "performer")
    with torch.no_grad():
        d = model.config.d_model
        model.blocks[-1].attn.qkv.weight[d:2 * d] *= 3e3  # the key projection
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(12, (1, 6), generator=gen)
    padded = torch.cat([tokens, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    alone = cls_attention(model, tokens)
    with_padding = cls_attention(model, padded, torch.tensor([6]))
    assert torch.isfinite(with_padding).all()
    torch.testing.assert_close(with_padding[..., :7], alone, rtol=1e-6, atol=1e-9)
    assert torch.all(with_padding[..., 7:] == 0)
