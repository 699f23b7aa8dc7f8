"""The registry's options: each encoding declares its options in its own file, every model
config inherits them flat, each builder reads only its own, and each bad value is refused."""

from dataclasses import fields

import pytest

from spe.encodings.registry import ENCODING_OPTIONS, POSITIONAL_SPECS, encoding_flags
from spe.models import ClassifierConfig, ModelConfig, TrunkConfig

SMALL = dict(vocab_size=40, d_model=16, num_layers=1, num_heads=2, d_ff=16, num_realizations=4, num_sines=2,
             kernel_size=3, num_features=8, chunk_size=4)
# The trunk's own options (not an encoding's): what any builder may read besides its options.
TRUNK_OWN = {"vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "dropout", "positional", "attention",
             "num_features", "chunk_size", "decay", "short_conv", "causal", "feature_dim"}


class _ReadRecorder:
    """A config that records which attributes a builder reads."""

    def __init__(self, config):
        self._config, self.read = config, set()

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self._config, name)


def test_every_option_is_a_flat_field_of_every_model_config():
    declared = [f.name for cls in ENCODING_OPTIONS for f in fields(cls)]
    assert len(declared) == len(set(declared)), "two encodings declare the same option"
    for config in (TrunkConfig, ModelConfig, ClassifierConfig):
        names = {f.name for f in fields(config)}
        assert set(declared) <= names
        assert all(f.kw_only for f in fields(config) if f.name in declared)
    # The options a spec lists are registered, and every registered class serves some spec.
    used = {cls for spec in POSITIONAL_SPECS.values() for cls in spec.options}
    assert used == set(ENCODING_OPTIONS)


@pytest.mark.parametrize("name", [n for n in POSITIONAL_SPECS if n != "none"])
def test_each_builder_reads_only_the_trunk_and_its_own_options(name):
    spec = POSITIONAL_SPECS[name]
    attention = {"scores": "softmax", "features": "linear-elu"}.get(spec.acts_on, "performer")
    config = TrunkConfig(**SMALL, positional=name, attention=attention)
    recorder = _ReadRecorder(config)
    spec.build_model_module(recorder)
    spec.build_layer_module(recorder, causal=True)
    spec.max_positions(recorder)
    own = {f.name for cls in spec.options for f in fields(cls)}
    assert recorder.read <= TRUNK_OWN | own, f"{name} reads {sorted(recorder.read - TRUNK_OWN - own)} " \
                                             f"without declaring them in its options"


# One bad value per options field that has a rule, and the words its error must hold.
BAD_OPTIONS = [
    ({"num_realizations": 0}, "num_realizations"), ({"spe_impl": "fast"}, "spe_impl"),
    ({"num_sines": -2}, "num_sines"), ({"frequency_init": "high"}, "frequency_init"),
    ({"code_noise": "uniform"}, "code_noise"), ({"kernel_size": 0}, "kernel_size"),
    ({"max_positions": 0}, "max_positions"), ({"max_distance": 0}, "max_distance"),
    ({"rope_base": 1.0}, "rope_base"), ({"rope_base": True}, "rope_base"), ({"lrpe_angles": "random"}, "lrpe_angles"),
    ({"permute_seed": 1.5}, "permute_seed"), ({"cosformer_max_length": 0}, "cosformer_max_length"),
    ({"spe_time": "clock"}, "spe_time"), ({"rope_time": "onset"}, "rope_time"), ({"onset_scale": -1.0}, "onset_scale"),
    ({"onset_scale": True}, "onset_scale"), ({"onset_tokens": ["Bar_None"]}, "onset_tokens"),
]


@pytest.mark.parametrize("bad,words", BAD_OPTIONS)
def test_each_encoding_refuses_a_bad_value_of_its_options_in_every_config(bad, words):
    # Checked whichever encoding is chosen: a config file's typo surfaces before a run, not when
    # the user later switches encodings.
    for config in (TrunkConfig, ModelConfig, ClassifierConfig):
        with pytest.raises(ValueError, match=words):
            config(**{**SMALL, "positional": "ape", **bad})


def test_the_flags_are_the_options_declared_with_one():
    flags = dict(encoding_flags())
    assert set(flags) == {"num_realizations", "num_sines", "kernel_size", "max_positions", "max_distance",
                          "lrpe_angles", "cosformer_max_length", "spe_time", "rope_time"}
    assert flags["lrpe_angles"]["choices"] == ("fixed", "learned")
    assert flags["rope_time"]["choices"] == ("index", "learned")
    assert flags["spe_time"]["choices"] == ("index", "learned", "onset")
    assert flags["cosformer_max_length"]["type"] is int
    assert all(keywords["help"] for keywords in flags.values())
