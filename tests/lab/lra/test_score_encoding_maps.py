"""CLS attention maps of encoders with score encodings are the weights their layers use."""

import pytest
import torch

from spe.lab.lra.attention import cls_attention
from spe.models import ClassifierConfig, EncoderClassifier


@pytest.mark.parametrize("positional", ["shaw", "music-relative", "alibi", "sinespe-exact", "convspe-exact"])
def test_cls_attention_with_a_score_term_is_the_layer_s_own_softmax(positional):
    torch.manual_seed(0)
    model = EncoderClassifier(ClassifierConfig(
        vocab_size=12, d_model=16, num_layers=1, num_heads=2, d_ff=32, dropout=0.0, positional=positional,
        attention="softmax", num_sines=2, kernel_size=3, gated=True, max_distance=3, num_classes=3)).eval()
    term = model.blocks[0].attn.score_encoding
    with torch.no_grad():
        for p in term.parameters():  # away from the small initial values, so the term matters
            p.copy_(torch.randn(p.shape))
        if positional == "shaw":
            term.rel_values.zero_()  # its value term is no attention weight
        model.blocks[0].attn.qkv.weight.normal_(0, 0.5)
    tokens, lengths = torch.randint(2, 12, (2, 7)), torch.tensor([7, 4])
    weights = cls_attention(model, tokens, lengths, layer=0)  # (B, H, 8)
    # the layer's own attention applied to one-hot values returns its weights
    seen = {}
    handle = model.blocks[0].attn.register_forward_pre_hook(
        lambda m, args, kwargs: seen.update(x=args[0], mask=kwargs["key_padding_mask"]), with_kwargs=True)
    with torch.no_grad():
        model.encode(tokens, lengths)
        handle.remove()
        q, k, _ = model.blocks[0].attn.project(seen["x"], None)
        eye = torch.eye(8).expand(2, 8, 8)[:, :, None, :].expand(2, 8, 2, 8)  # (B, L, H, L)
        used = term.attend(q, k, eye, key_padding_mask=seen["mask"])[:, 0]  # (B, H, L)
    torch.testing.assert_close(weights, used, atol=1e-5, rtol=1e-5)
    assert weights[1, :, 5:].abs().max() == 0  # padding gets nothing
