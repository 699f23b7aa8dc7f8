"""The music language model, a task on the engine (needs the ``music`` extra): its configuration, run
status and training loop here; data (corpus, split, dataset, grammar), plans (plan.py), evaluation and
generation in the package's modules.

:class:`TrainConfig` resolves the model defaults that depend on other options
(:func:`resolve_model_options`); :func:`run_status` says whether a run folder is new,
resumable or finished; :func:`spe.lab.music.train.train` trains.
"""

from spe.lab.music.config import TrainConfig, load_config_file, packaged_config, resolve_model_options
from spe.lab.music.status import RunStatus, run_status

__all__ = ["RunStatus", "TrainConfig", "load_config_file", "packaged_config", "resolve_model_options",
           "run_status"]
