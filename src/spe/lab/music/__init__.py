"""Training (needs the ``music`` extra for data): configuration, run status, the loop.

:class:`TrainConfig` resolves the model defaults that depend on other options
(:func:`resolve_model_options`); :func:`run_status` says whether a run folder is new,
resumable or finished; :func:`spe.lab.music.train.train` trains.
"""

from spe.lab.music.config import TrainConfig, load_config_file, packaged_config, resolve_model_options
from spe.lab.music.status import RunStatus, run_status

__all__ = ["RunStatus", "TrainConfig", "load_config_file", "packaged_config", "resolve_model_options",
           "run_status"]
