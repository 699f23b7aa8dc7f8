"""The field's synthetic tasks on the one training engine (``spe synth``, docs/synth.md): flip-flop
language modelling (Liu et al. 2023) and multi-query associative recall (Arora et al. 2023)."""

from spe.lab.synth.config import SynthConfig, preset_config
from spe.lab.synth.run import run_synth, train_seed, write_data
from spe.lab.synth.study import SynthPlans

__all__ = ["SynthConfig", "SynthPlans", "preset_config", "run_synth", "train_seed", "write_data"]
