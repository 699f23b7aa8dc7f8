"""Trunk: one code path under both heads, parameter names of old checkpoints, token checks without stalls."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

from spe.models import ClassifierConfig, DecoderLM, EncoderClassifier, ModelConfig, Trunk
from spe.models.trunk import check_in_range, check_token_ids

TRUNK = dict(vocab_size=30, d_model=16, num_layers=1, num_heads=2, d_ff=32, dropout=0.0, num_realizations=8,
             num_sines=2, kernel_size=5, num_features=16, chunk_size=4, max_positions=64, gated=True)


def _pair(positional, attention):
    """A language model and a classifier (mean pooling, no CLS) built from the same trunk options."""
    torch.manual_seed(0)
    lm = DecoderLM(ModelConfig(positional=positional, attention=attention, tie_embeddings=False, **TRUNK)).eval()
    clf = EncoderClassifier(ClassifierConfig(positional=positional, attention=attention, pooling="mean",
                                             num_classes=3, **TRUNK)).eval()
    return lm, clf


@pytest.mark.parametrize("positional", ["ape", "sinespe", "rope", "none"])
@pytest.mark.parametrize("attention", ["softmax", "performer"])
def test_both_heads_run_the_same_trunk(positional, attention):
    lm, clf = _pair(positional, attention)
    missing, unexpected = clf.load_state_dict({k: v for k, v in lm.state_dict().items() if k != "head.weight"},
                                              strict=False)
    assert not unexpected and missing == [k for k in clf.state_dict() if k.startswith("head.")]
    tokens = torch.randint(0, 30, (2, 11), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(11)
    with torch.no_grad():
        causal, bidirectional = lm.hidden(tokens, positions), clf.hidden(tokens, positions)
        # what each head's forward feeds its head is the trunk's output
        torch.testing.assert_close(lm(tokens), lm.head(causal), atol=0, rtol=0)
        torch.testing.assert_close(clf(tokens), clf.head(bidirectional.mean(1)), atol=1e-6, rtol=1e-6)
    # One layer: the last position attends to every position either way, so the two trunks
    # agree there (up to float32 rounding of differently ordered sums); the first position
    # sees only itself when causal, everything otherwise.
    torch.testing.assert_close(causal[:, -1], bidirectional[:, -1], atol=2e-5, rtol=2e-5)
    assert (causal[:, 0] - bidirectional[:, 0]).abs().max() > 1e-3


def test_both_heads_draw_codes_through_one_signature():
    lm, clf = _pair("sinespe", "performer")
    clf.load_state_dict({k: v for k, v in lm.state_dict().items() if k != "head.weight"}, strict=False)
    (a,), (b,), (c,) = lm.draw_codes(7), clf.draw_codes(torch.arange(7)), lm.draw_codes(torch.arange(7))
    for x, y in ((a, b), (a, c)):  # eval mode: the noise of config.code_seed
        assert torch.equal(x.weights, y.weights)


# State-dict keys written by the code before the trunk (commit 35479dc, printed from it), which
# checkpoints hold; the attention layer's own keys (blocks.N.attn.*) are that layer's contract.
OLD_KEYS = ["embed.weight", "encoding.frequency_logits", "encoding.phases", "encoding.gains",
            "layer_encodings.0.frequency_logits", "layer_encodings.0.phases", "layer_encodings.0.gains",
            "blocks.0.norm1.weight", "blocks.0.norm1.bias", "blocks.0.norm2.weight", "blocks.0.norm2.bias",
            "blocks.0.ffn.0.weight", "blocks.0.ffn.0.bias", "blocks.0.ffn.2.weight", "blocks.0.ffn.2.bias",
            "blocks.1.norm1.weight", "blocks.1.norm1.bias", "blocks.1.norm2.weight", "blocks.1.norm2.bias",
            "blocks.1.ffn.0.weight", "blocks.1.ffn.0.bias", "blocks.1.ffn.2.weight", "blocks.1.ffn.2.bias",
            "norm.weight", "norm.bias"]
OLD_HEADS = {DecoderLM: ["head.weight"], EncoderClassifier: ["head.0.weight", "head.0.bias", "head.2.weight",
                                                              "head.2.bias"]}


def test_parameter_names_are_those_of_old_checkpoints():
    options = {**TRUNK, "num_layers": 2, "share_across_layers": False}
    for model in (DecoderLM(ModelConfig(**options)), EncoderClassifier(ClassifierConfig(**options))):
        names = [k for k in model.state_dict() if ".attn." not in k]
        assert names == OLD_KEYS + OLD_HEADS[type(model)]


class HostReads(TorchFunctionMode):
    """Counts the tensor calls that copy a value to the host (a stall on a GPU)."""

    NAMES = {"__int__", "__bool__", "__float__", "__index__", "item", "tolist"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in self.NAMES
        return func(*args, **(kwargs or {}))


def test_a_forward_of_the_paper_model_reads_the_host_once_on_the_cpu():
    model = DecoderLM(ModelConfig(positional="sinespe", attention="performer", **TRUNK)).eval()
    tokens = torch.randint(0, 30, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), HostReads() as reads:
        model(tokens)
    assert reads.count == 1  # the token check's min and max, read together (two reads before)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 30\), got \[-1, 30\]"):
        model(torch.tensor([[3, -1, 30]]))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 30\), got \[3, 31\]"):
        model.step(torch.tensor([3, 31]))


def test_the_device_side_assertion_reads_nothing_and_names_the_bounds():
    values = torch.tensor([[0, 5, 9]])
    with HostReads() as reads:
        check_in_range(values, 0, 9, lambda lo, hi: "unused", asynchronous=True)
    assert reads.count == 0
    with pytest.raises(RuntimeError, match=r"token ids must lie in \[0, 9\), got \[0, 8\]"):
        check_in_range(values, 0, 8, lambda lo, hi: f"token ids must lie in [0, 9), got [{lo}, {hi}]",
                       asynchronous=True)  # on the CPU the assertion raises at once
    check_token_ids(torch.zeros(0, 4, dtype=torch.long), 1)  # empty: nothing to check


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_token_check_reads_nothing():
    model = DecoderLM(ModelConfig(positional="sinespe", attention="performer", **TRUNK)).cuda()
    tokens = torch.randint(0, 30, (2, 9), device="cuda")
    with HostReads() as reads:
        model.check_tokens(tokens)
    assert reads.count == 0


def test_a_trunk_without_a_head_says_so():
    with pytest.raises(NotImplementedError, match="build_head"):
        Trunk(ModelConfig(**TRUNK), causal=True)


@pytest.mark.parametrize("fixed", [False, True])
def test_fixed_code_trains_on_the_code_evaluation_uses(fixed):
    """``fixed_code``: every training step draws config.code_seed's code (whatever generator the
    loop passes), the one eval mode draws; without it two steps draw two codes."""
    torch.manual_seed(0)
    clf = EncoderClassifier(ClassifierConfig(positional="sinespe", attention="performer", pooling="mean",
                                             num_classes=3, fixed_code=fixed, **TRUNK))
    tokens = torch.randint(0, 30, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        first = clf.train()(tokens, generator=torch.Generator().manual_seed(5))
        second = clf(tokens, generator=torch.Generator().manual_seed(6))
        evaluated = clf.eval()(tokens)
    assert torch.equal(first, second) == fixed
    assert torch.equal(first, evaluated) == fixed
    assert ("fixed_code" in clf.config.to_dict()) == fixed  # headers without it stay as they were
    assert ClassifierConfig.from_dict(clf.config.to_dict()).fixed_code == fixed
