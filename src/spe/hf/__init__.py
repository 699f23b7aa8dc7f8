"""spe's models in Hugging Face ``transformers`` (the ``hf`` extra: ``pip install 'spe[hf]'``).

Importing this package registers :class:`SPEConfig` (``model_type`` "spe") with
``AutoConfig``, :class:`SPEForCausalLM` with ``AutoModelForCausalLM`` and
:class:`SPEForSequenceClassification` with ``AutoModelForSequenceClassification``, so a folder
written by ``save_pretrained`` (or ``spe export``) opens with the Auto classes. ``import spe``
never imports ``transformers``; this package does.
"""

try:
    import transformers
except ModuleNotFoundError as err:  # the message says how to get it
    raise ModuleNotFoundError(f"spe.hf needs transformers ({err}); install the hf extra: pip install 'spe[hf]'",
                              name=err.name) from None

from spe.hf.configuration import SPEConfig
from spe.hf.modeling import SPECache, SPEForCausalLM, SPEForSequenceClassification, SPEPreTrainedModel

__all__ = ["SPECache", "SPEConfig", "SPEForCausalLM", "SPEForSequenceClassification", "SPEPreTrainedModel"]

transformers.AutoConfig.register(SPEConfig.model_type, SPEConfig, exist_ok=True)
transformers.AutoModelForCausalLM.register(SPEConfig, SPEForCausalLM, exist_ok=True)
transformers.AutoModelForSequenceClassification.register(SPEConfig, SPEForSequenceClassification, exist_ok=True)
