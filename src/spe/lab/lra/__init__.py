"""Long Range Arena experiments: presets, training of encoder classifiers, results (``spe lra``)."""

from spe.lab.lra.config import PRESETS, LRAConfig, load_preset, model_options, preset_config
from spe.lab.lra.evaluate import accuracy
from spe.lab.lra.run import default_folder, load_splits, run_lra, summarize
from spe.lab.lra.study import LRAPlans, StudyPlan
from spe.lab.lra.task import build_classifier
from spe.lab.lra.train import train_seed
from spe.lab.options import parse_seeds

__all__ = ["PRESETS", "LRAConfig", "LRAPlans", "StudyPlan", "accuracy", "build_classifier", "default_folder",
           "load_preset", "load_splits", "model_options", "parse_seeds", "preset_config", "run_lra", "summarize",
           "train_seed"]
