"""Long Range Arena experiments: presets, training of encoder classifiers, results (``spe lra``)."""

from spe.lra.config import PRESETS, LRAConfig, load_preset, preset_config
from spe.lra.evaluate import accuracy
from spe.lra.run import load_splits, run_lra, summarize
from spe.lra.train import build_classifier, train_seed

__all__ = ["PRESETS", "LRAConfig", "accuracy", "build_classifier", "load_preset", "load_splits", "preset_config",
           "run_lra", "summarize", "train_seed"]
