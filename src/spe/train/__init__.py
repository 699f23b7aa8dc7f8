"""Training (needs the ``music`` extra for data)."""

from spe.train.config import TrainConfig, load_config_file

__all__ = ["TrainConfig", "load_config_file"]
