"""Each decay reaches the layer through one protocol (:mod:`spe.attention.decays`): a model's
logits, in parallel and step by step, are bitwise those recorded before the decay became an
object (float64, one thread, fixed seeds, ATen's AVX2 kernels: SHA-256 of the logits' bytes)."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spe.attention.decays import DECAYS
from spe.attention.kernels import decay_form
from spe.attention.layer import MultiHeadAttention
from spe.models import ModelConfig
from spe.models.decoder_lm import DecoderLM
from spe.ops.decay import DECAY_MODES

# (decay, attention, positional) -> the first 16 hex digits of SHA-256(parallel logits ‖ step logits)
RECORDED = {
    ("none", "linear-elu", "rope"): "bd178db85c62b9cd",
    ("fixed", "linear-elu", "rope"): "1b0f01a07b1c63b0",
    ("learned", "performer", "sinespe"): "e0fa7209e659f508",
    ("gated", "softmax", "none"): "4226ee5ac7c8c4de",
    ("gated", "linear-elu", "sinespe"): "d2aecc8d9ff87162",
    ("gated-channel", "linear-elu", "rope"): "25be9dee8b87ee06",
    ("gated-channel", "linear-elu", "sinespe"): "80ff6c8f53feb06a",
}


# ATen's vectorised kernels (softmax's exp) round the last bits differently per instruction set: the
# digests were recorded with its AVX2 kernels, which an AVX-512 machine runs when told to
RECORDED_CAPABILITY = "AVX2"


def _digest(case: tuple[str, str, str]) -> str:
    """The first 16 hex digits of SHA-256(parallel logits ‖ step logits) of a small float64 model, one
    thread (the sums' order, hence the last bits, depend on the thread count)."""
    decay, attention, positional = case
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        extra = {"num_realizations": 8} if positional == "sinespe" else {}
        config = ModelConfig(vocab_size=30, d_model=16, num_heads=2, num_layers=2, d_ff=32, dropout=0.0,
                             chunk_size=4, decay=decay, attention=attention, positional=positional, **extra)
        model = DecoderLM(config).double().eval()
        tokens = torch.randint(0, 30, (2, 9), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            full = model(tokens)
            state, steps = None, []
            for t in range(tokens.shape[1]):
                out, state = model.step(tokens[:, t], state)
                steps.append(out)
    finally:
        torch.set_num_threads(threads)
    return hashlib.sha256(full.numpy().tobytes() + torch.stack(steps, 1).numpy().tobytes()).hexdigest()[:16]


@pytest.fixture(scope="module")
def digests() -> dict:
    """case -> digest, computed under :data:`RECORDED_CAPABILITY` (in a child process told to use it
    when this one runs other kernels)."""
    if torch.backends.cpu.get_cpu_capability() == RECORDED_CAPABILITY:
        return {case: _digest(case) for case in RECORDED}
    code = ("import json, sys, torch; sys.path.insert(0, sys.argv[1]); import test_decay_protocol as t; "
            "print(json.dumps([torch.backends.cpu.get_cpu_capability(), {'|'.join(c): t._digest(c) for c in t.RECORDED}]))")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": RECORDED_CAPABILITY.lower()}
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], env=env, capture_output=True,
                          text=True, check=True)
    capability, found = json.loads(done.stdout.strip().splitlines()[-1])
    if capability != RECORDED_CAPABILITY:
        pytest.skip(f"the digests were recorded with ATen's {RECORDED_CAPABILITY} kernels; this CPU runs {capability}")
    return {tuple(k.split("|")): v for k, v in found.items()}


@pytest.mark.parametrize("case", list(RECORDED), ids="-".join)
def test_logits_per_decay_are_bitwise_the_recorded_ones(case, digests):
    assert digests[case] == RECORDED[case]


@pytest.mark.parametrize("name", DECAY_MODES)
def test_each_decay_hands_the_kernel_the_form_it_declares(name):
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, attention="linear-elu", decay=name)
    assert layer.decay_kind is DECAYS[name]
    x = torch.randn(2, 5, 16)
    assert decay_form(layer.log_decay(x)) == DECAYS[name].form
    if DECAYS[name].from_input:
        with pytest.raises(ValueError, match=f"{name}.*pass x"):
            layer.log_decay()
        padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
        assert (layer.log_decay(x, padding)[1, 3:] == 0).all()  # padding keeps the state
