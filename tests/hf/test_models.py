"""spe's models as transformers models (spe.hf): every option carried, logits bit-identical through
save_pretrained / from_pretrained, generate() on the model's own recurrent state, Trainer."""

import subprocess
import sys

import pytest
import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, Trainer,
                          TrainingArguments)

from spe.encodings.onset import onset_tokens
from spe.generation import generate
from spe.hf import SPECache, SPEConfig, SPEForCausalLM, SPEForSequenceClassification
from spe.models import ClassifierConfig, DecoderLM, EncoderClassifier, ModelConfig

V = 40
TINY = {"d_model": 16, "num_layers": 2, "num_heads": 2, "d_ff": 32, "dropout": 0.0, "num_realizations": 4,
        "num_features": 8, "chunk_size": 4}
# One model per family of options: kernels, decays and gates, FoX-Pro, PaTH, learned and onset clocks,
# windows, short convolutions, block-local attention.
VARIANTS = {
    "performer-sinespe": {"positional": "sinespe", "attention": "performer", "gated": True},
    "fox-pro": {"positional": "none", "attention": "softmax", "decay": "gated", "output_gate": True,
                "qk_norm": True, "kv_shift": True, "output_norm": True},
    "path-fox": {"positional": "path", "attention": "softmax", "decay": "gated"},
    "learned-time": {"positional": "sinespe", "attention": "linear", "spe_time": "learned", "decay": "gated"},
    "rope-retnet-window": {"positional": "rope", "attention": "linear", "decay": "fixed", "short_conv": 4,
                           "attention_window": 8, "tie_embeddings": False},
    "music-relative-blocks": {"positional": "music-relative", "attention": "softmax", "attention_blocks": 4,
                              "max_distance": 8},
}


def _remi_vocab() -> dict:
    from spe.lab.music.corpus import make_tokenizer

    return make_tokenizer().vocab


def _decoder(name: str, seed: int = 0) -> DecoderLM:
    options = {**TINY, **VARIANTS.get(name, {})}
    vocab = V
    if name == "onset-clock":
        vocab_map = _remi_vocab()
        vocab = len(vocab_map)
        options.update(positional="sinespe", attention="linear", spe_time="onset",
                       onset_tokens=onset_tokens(vocab_map), onset_scale=1.5)
    torch.manual_seed(seed)
    return DecoderLM(ModelConfig(vocab_size=vocab, **options)).eval()


ALL = [*VARIANTS, "onset-clock"]


def _prompt(model: DecoderLM, length: int = 6, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ALL)
def test_every_option_is_carried_and_logits_are_bit_identical_after_save_and_load(name, tmp_path):
    spe_model = _decoder(name)
    hf = SPEForCausalLM.from_spe(spe_model)
    assert hf.model.config == spe_model.config
    tokens = _prompt(spe_model, 12)
    expected = spe_model(tokens)
    assert torch.equal(hf(tokens).logits, expected)
    hf.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is SPEForCausalLM and not loaded.training
    assert loaded.model.config == spe_model.config
    assert torch.equal(loaded(tokens).logits, expected)
    tied = loaded.model.head.weight is loaded.model.embed.weight
    assert tied == spe_model.config.tie_embeddings


@pytest.mark.parametrize("name", ALL)
def test_greedy_generate_with_the_state_without_it_and_spe_generate_give_the_same_tokens(name):
    spe_model = _decoder(name)
    hf = SPEForCausalLM.from_spe(spe_model)
    prompt = _prompt(spe_model)
    cached = hf.generate(prompt, max_new_tokens=12, do_sample=False)
    uncached = hf.generate(prompt, max_new_tokens=12, do_sample=False, use_cache=False)
    # spe generate's greedy limit: a temperature so small that the most likely token takes all the mass
    ours = generate(spe_model, prompt[0].tolist(), 12, temperature=1e-30, top_p=1.0)
    assert cached.shape == (1, 18)
    assert cached[0].tolist() == ours
    assert torch.equal(cached, uncached)


def test_decoding_reads_each_new_token_once_from_the_state(monkeypatch):
    """generate() runs one parallel pass over the prompt and one recurrent step a token, never the
    whole sequence again, and a linear model's state keeps its size: the same cost per token."""
    hf = SPEForCausalLM.from_spe(_decoder("performer-sinespe"))
    calls = {"forward": 0, "prefill": 0, "step": 0}
    for name in calls:
        original = getattr(DecoderLM, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(DecoderLM, name, counted)
    hf.generate(_prompt(hf.model), max_new_tokens=20, do_sample=False)
    assert calls == {"forward": 0, "prefill": 1, "step": 19}
    cache = hf(_prompt(hf.model, 5), use_cache=True).past_key_values
    sizes = [t.numel() for t in _tensors(cache.state)]
    for token in range(30):
        cache = hf(torch.tensor([[token % V]]), past_key_values=cache).past_key_values
    assert cache.get_seq_length() == 35 and isinstance(cache, SPECache)
    assert [t.numel() for t in _tensors(cache.state)] == sizes


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if hasattr(value, "__dataclass_fields__"):
        return [t for name in value.__dataclass_fields__ for t in _tensors(getattr(value, name))]
    return []


def test_sampling_options_work_through_the_generation_config():
    hf = SPEForCausalLM.from_spe(_decoder("performer-sinespe"))
    prompt = _prompt(hf.model)
    torch.manual_seed(3)
    first = hf.generate(prompt, max_new_tokens=15, do_sample=True, top_p=0.9, temperature=1.2)
    torch.manual_seed(3)
    again = hf.generate(prompt, max_new_tokens=15, do_sample=True, top_p=0.9, temperature=1.2)
    torch.manual_seed(4)
    hot = hf.generate(prompt, max_new_tokens=15, do_sample=True, top_p=1.0, temperature=50.0)
    greedy = hf.generate(prompt, max_new_tokens=15, do_sample=False)
    torch.manual_seed(3)
    nucleus_of_one = hf.generate(prompt, max_new_tokens=15, do_sample=True, top_p=1e-6)
    assert first.shape == (1, 21) and torch.equal(first, again)
    assert not torch.equal(hot, greedy)
    assert torch.equal(nucleus_of_one, greedy)


def test_auto_classes_know_spe():
    config = AutoConfig.for_model("spe", vocab_size=V, **TINY)
    assert type(config) is SPEConfig
    assert type(AutoModelForCausalLM.from_config(config)) is SPEForCausalLM


def test_options_that_cannot_be_carried_or_do_not_apply_are_refused_naming_them():
    config = ModelConfig(vocab_size=V, **TINY)
    config.rope_base = float("nan")  # a value config.json cannot hold
    with pytest.raises(ValueError, match="rope_base"):
        SPEConfig.from_spe(config)
    with pytest.raises(ValueError, match="pooling"):
        SPEConfig(vocab_size=V, pooling="mean")
    with pytest.raises(ValueError, match="'nope'"):
        SPEForCausalLM(SPEConfig(vocab_size=V, positional="nope"))
    with pytest.raises(ValueError, match="attention_mask"):
        SPEForCausalLM.from_spe(_decoder("fox-pro"))(torch.ones(2, 3, dtype=torch.long),
                                                     attention_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]))
    with pytest.raises(ValueError, match="num_beams"):
        SPEForCausalLM.from_spe(_decoder("fox-pro")).generate(torch.ones(1, 3, dtype=torch.long), num_beams=2,
                                                              max_new_tokens=3, do_sample=False)


def test_the_loss_is_ours_and_a_trainer_trains_the_model(tmp_path):
    spe_model = _decoder("rope-retnet-window")
    hf = SPEForCausalLM.from_spe(spe_model)
    batch = torch.randint(0, V, (4, 16), generator=torch.Generator().manual_seed(2))
    assert torch.allclose(hf(batch, labels=batch).loss, spe_model.loss(batch), rtol=1e-6, atol=1e-6)
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    data = [{"input_ids": row, "labels": row} for row in batch]  # one batch of the whole set: any order
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4,
                             learning_rate=1e-2, report_to=[], use_cpu=True, save_strategy="no", logging_steps=1,
                             disable_tqdm=True, seed=0, data_seed=0)
    expected = spe_model.train().loss(batch).item()  # no dropout, no noise: train mode is deterministic
    trainer = Trainer(model=hf.train(), args=args, train_dataset=data)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3
    assert losses[0] == pytest.approx(expected, abs=1e-4)  # the Trainer logs 4 decimals
    assert losses[-1] < losses[0]
    trained = hf.state_dict()
    assert all(not torch.equal(before[k], trained[k]) for k in ("model.embed.weight", "model.head.weight"))


@pytest.mark.parametrize("interaction", [None, "nli"])
def test_the_encoder_classifier_round_trips_with_its_padding(interaction, tmp_path):
    torch.manual_seed(0)
    spe_model = EncoderClassifier(ClassifierConfig(vocab_size=V, num_classes=3, pooling="mean",
                                                   interaction=interaction, positional="sinespe",
                                                   attention="performer", **TINY)).eval()
    hf = SPEForSequenceClassification.from_spe(spe_model)
    tokens = torch.randint(2, V, (3, 10), generator=torch.Generator().manual_seed(5))
    lengths = torch.tensor([10, 7, 4])
    mask = (torch.arange(10)[None] < lengths[:, None]).long()
    pair = {"input_ids2": tokens.flip(1), "attention_mask2": mask} if interaction else {}
    expected = spe_model(tokens, lengths, *((tokens.flip(1), lengths) if interaction else ()))
    assert torch.equal(hf(tokens, attention_mask=mask, **pair).logits, expected)
    hf.save_pretrained(tmp_path)
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path)
    assert type(loaded) is SPEForSequenceClassification and loaded.config.num_labels == 3
    out = loaded(tokens, attention_mask=mask, labels=torch.tensor([0, 1, 2]), **pair)
    assert torch.equal(out.logits, expected) and out.loss.item() > 0
    with pytest.raises(ValueError, match="right padding"):
        loaded(tokens, attention_mask=mask.flip(1), **pair)


def test_the_library_imports_without_transformers_and_spe_hf_says_how_to_get_it():
    code = ("import sys; sys.modules['transformers'] = None\n"
            "import spe, spe.checkpoint, spe.generation\n"
            "try:\n    import spe.hf\nexcept ModuleNotFoundError as err:\n    print(err)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "spe[hf]" in done.stdout
