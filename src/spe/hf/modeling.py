"""spe's models as ``transformers`` models: :class:`SPEForCausalLM` and :class:`SPEForSequenceClassification`.

Each wraps the model of spe (``.model``: a :class:`~spe.models.DecoderLM` or an
:class:`~spe.models.EncoderClassifier`, built from :meth:`SPEConfig.spe_config`), so the
weights, the codes and the logits are spe's own; ``save_pretrained`` / ``from_pretrained``
write and read them as safetensors under ``model.`` (tied weights once).

Decoding in ``generate()`` goes on from the model's own recurrent state (:class:`SPECache`,
holding a :class:`~spe.models.DecodingState`, as flash-linear-attention's models hold
theirs): the prompt in one parallel pass (:meth:`~spe.models.DecoderLM.prefill`), then one
:meth:`~spe.models.DecoderLM.step` a token, so a linear-attention model costs the same per
token at any length. These are the calls :func:`spe.generate` (``spe generate``) makes,
so greedy decoding gives its tokens.

Letters: B = batch, L = length, V = vocab_size, K = num_classes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast, SequenceClassifierOutput

from spe.hf.configuration import SPEConfig
from spe.models.decoder_lm import DecoderLM, DecodingState
from spe.models.encoder_classifier import EncoderClassifier
from spe.models.loss import cross_entropy

__all__ = ["SPECache", "SPEForCausalLM", "SPEForSequenceClassification", "SPEPreTrainedModel"]

# transformers' label for positions without a target (labels = input_ids with padding set to it).
IGNORE_INDEX = -100


class SPECache(Cache):
    """The decoding state of an :class:`SPEForCausalLM` as ``past_key_values``.

    Attributes:
        state: the :class:`~spe.models.DecodingState` after the tokens fed so far (None before
            the first): running sums of linear attention, softmax's keys and values, the onset
            clock … as :meth:`~spe.models.DecoderLM.step` keeps them.
    """

    is_compileable = False

    def __init__(self, state: DecodingState | None = None) -> None:
        super().__init__(layers=[])
        self.state = state

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        """Positions the state has read."""
        return 0 if self.state is None else self.state.position

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return -1  # no bound: the state does not grow with linear attention

    def reorder_cache(self, beam_idx: Tensor) -> None:
        raise ValueError("beam search (num_beams > 1) is not supported by SPEForCausalLM: its recurrent state "
                         "cannot be reordered; use greedy decoding or sampling")

    def __repr__(self) -> str:
        return f"SPECache(position={self.get_seq_length()})"


class SPEPreTrainedModel(PreTrainedModel):
    """What both wrappers share: the config class, the prefix of the weights (``model.``) and no
    re-initialisation (spe's modules initialise themselves when built)."""

    config_class = SPEConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    # the loss is a mean over the batch's targets: the Trainer divides it for gradient accumulation
    accepts_loss_kwargs = False

    def _init_weights(self, module: nn.Module) -> None:
        """Nothing: spe's modules draw their own initial weights when built."""

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed = value

    @classmethod
    def _from_spe(cls, model: nn.Module, expected: type, **kwargs):
        if not isinstance(model, expected):
            hint = ": pass its .model" if hasattr(model, "model") and hasattr(model, "metadata") else ""
            raise TypeError(f"{cls.__name__}.from_spe takes a {expected.__name__}, got {type(model).__name__}{hint}")
        wrapped = cls(SPEConfig.from_spe(model.config, **kwargs))
        wrapped.model.load_state_dict(model.state_dict())
        return wrapped.to(next(model.parameters()).device).train(model.training)


def _check_mask(attention_mask: Tensor | None, what: str) -> None:
    if attention_mask is not None and not bool(attention_mask.bool().all()):
        raise ValueError(f"attention_mask with zeros (padding) is not supported by {what}: pass sequences "
                         "of one length, unpadded")


class SPEForCausalLM(SPEPreTrainedModel, GenerationMixin):
    """An spe decoder language model (:class:`~spe.models.DecoderLM`) as a ``transformers`` causal LM.

    ``model(input_ids)`` gives (B, L, V) logits; with ``labels`` (``labels = input_ids``, as
    ``transformers`` does: the shift is inside, positions labelled −100 ignored) also the
    mean next-token cross-entropy in nats, which is :meth:`DecoderLM.loss` on the same tokens.
    ``generate()`` works through :class:`~transformers.GenerationConfig` (``max_new_tokens``,
    ``do_sample``, ``top_p``, ``temperature`` …) on :class:`SPECache`; ``use_cache=False``
    recomputes the whole sequence each token instead (same tokens). Beam search and padded
    batches (zeros in ``attention_mask``) are refused.

    Args:
        config: an :class:`SPEConfig` of ``spe_kind`` "decoder-lm".

    Raises:
        ValueError: for another kind, or options the model refuses (one line naming the option).
    """

    _tied_weights_keys = ["model.head.weight"]
    # the state cannot be cut back: no assisted decoding, no cache built by transformers
    _is_stateful = True

    def __init__(self, config: SPEConfig) -> None:
        if config.spe_kind != DecoderLM.MODEL_KIND:
            raise ValueError(f"SPEForCausalLM needs spe_kind {DecoderLM.MODEL_KIND!r}, got {config.spe_kind!r}")
        super().__init__(config)
        self.model = DecoderLM(config.spe_config())
        self.post_init()

    @classmethod
    def from_spe(cls, model: DecoderLM, **kwargs) -> SPEForCausalLM:
        """The same model (a copy of its weights, same device and mode) as an SPEForCausalLM.

        Args:
            model: a :class:`~spe.models.DecoderLM` (``spe.load(run).model``).
            **kwargs: :class:`~transformers.PretrainedConfig`'s options (``eos_token_id`` …).

        Raises:
            TypeError: for another model. ValueError: as :meth:`SPEConfig.from_spe`.
        """
        return cls._from_spe(model, DecoderLM, **kwargs)

    def get_output_embeddings(self) -> nn.Linear:
        return self.model.head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.model.head = value

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                past_key_values: SPECache | None = None, labels: Tensor | None = None,
                use_cache: bool | None = None, inputs_embeds: Tensor | None = None,
                return_dict: bool | None = None, **kwargs) -> CausalLMOutputWithPast:
        """Args:
            input_ids: (B, L) token ids in [0, V); after a cache, the tokens that follow it.
            attention_mask: (B, L) or (B, past + L) ones; zeros are refused.
            past_key_values: an :class:`SPECache` to go on from (in eval mode only: decoding
                runs without gradients).
            labels: (B, L) targets, ``input_ids`` or −100 where none; shifted inside.
            use_cache: return the state after ``input_ids`` (:meth:`DecoderLM.prefill`, the
                prompt pass of decoding; ``generate()`` asks for it). Default: True with
                ``past_key_values``, else False: :meth:`DecoderLM.forward`, the logits of
                ``spe.load(run).model(input_ids)`` bit for bit. Never in training mode, which
                runs the parallel forward with gradients.
            inputs_embeds: refused (the model reads token ids).
            return_dict: ignored (always a :class:`~transformers.modeling_outputs.CausalLMOutputWithPast`).
            **kwargs: what ``transformers`` passes beside (``cache_position``, ``position_ids``):
                ignored, positions run on from the cache.

        Returns:
            ``logits`` (B, L, V), ``loss`` with labels, ``past_key_values`` (an :class:`SPECache`)
            with ``use_cache``.

        Raises:
            ValueError: on ``inputs_embeds``, padding, a cache in training mode, labels of
                another shape, and as :meth:`DecoderLM.forward`.
        """
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("SPEForCausalLM reads token ids: pass input_ids, not inputs_embeds")
        _check_mask(attention_mask, "SPEForCausalLM")
        use_cache = (past_key_values is not None if use_cache is None else use_cache) and not self.training
        cached = past_key_values is not None and past_key_values.state is not None
        if cached and self.training:
            raise ValueError("SPEForCausalLM decodes from a cache in eval mode only: call model.eval() first")
        if cached:
            logits, state = self._steps(input_ids, past_key_values.state)
        elif use_cache:
            logits, state = self.model.prefill(input_ids)
        else:
            logits, state = self.model(input_ids), None
        loss = None if labels is None else self._loss(logits, labels)
        cache = None
        if use_cache:
            cache = past_key_values if past_key_values is not None else SPECache()
            cache.state = state
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache)

    def _steps(self, input_ids: Tensor, state: DecodingState) -> tuple[Tensor, DecodingState]:
        """(B, L) tokens after ``state``, one recurrent step each: (B, L, V) logits and the state after them."""
        logits = []
        for i in range(input_ids.shape[1]):
            step, state = self.model.step(input_ids[:, i], state)
            logits.append(step)
        return torch.stack(logits, dim=1), state

    @staticmethod
    def _loss(logits: Tensor, labels: Tensor) -> Tensor:
        if labels.shape != logits.shape[:2]:
            raise ValueError(f"labels must have the shape of input_ids {tuple(logits.shape[:2])}, got "
                             f"{tuple(labels.shape)}")
        # the package's one cross-entropy; transformers' −100 (IGNORE_INDEX) is its ignored target too
        return cross_entropy(logits[:, :-1], labels[:, 1:].to(logits.device))

    def prepare_inputs_for_generation(self, input_ids: Tensor, past_key_values: SPECache | None = None,
                                      attention_mask: Tensor | None = None, use_cache: bool = True,
                                      **kwargs) -> dict:
        """The tokens the cache has not read yet (all of them without one), and the cache."""
        if past_key_values is not None:
            input_ids = input_ids[:, past_key_values.get_seq_length():]
        return {"input_ids": input_ids, "past_key_values": past_key_values, "attention_mask": attention_mask,
                "use_cache": use_cache}


class SPEForSequenceClassification(SPEPreTrainedModel):
    """An spe encoder classifier (:class:`~spe.models.EncoderClassifier`, ``spe lra``'s) as a
    ``transformers`` sequence classifier.

    ``model(input_ids, attention_mask)`` gives (B, K) logits; right padding is read from
    ``attention_mask`` (the classifier's lengths); with ``labels`` (B,) also the mean
    cross-entropy. Two-tower classifiers (``interaction``) take the second documents as
    ``input_ids2`` / ``attention_mask2``.

    Args:
        config: an :class:`SPEConfig` of ``spe_kind`` "encoder-classifier".

    Raises:
        ValueError: for another kind, or options the model refuses.
    """

    def __init__(self, config: SPEConfig) -> None:
        if config.spe_kind != EncoderClassifier.MODEL_KIND:
            raise ValueError(f"SPEForSequenceClassification needs spe_kind {EncoderClassifier.MODEL_KIND!r}, got "
                             f"{config.spe_kind!r}")
        super().__init__(config)
        self.model = EncoderClassifier(config.spe_config())
        self.post_init()

    @classmethod
    def from_spe(cls, model: EncoderClassifier, **kwargs) -> SPEForSequenceClassification:
        """The same classifier (a copy of its weights, same device and mode) as a
        SPEForSequenceClassification; arguments and errors as :meth:`SPEForCausalLM.from_spe`."""
        return cls._from_spe(model, EncoderClassifier, **kwargs)

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                labels: Tensor | None = None, input_ids2: Tensor | None = None,
                attention_mask2: Tensor | None = None, inputs_embeds: Tensor | None = None,
                return_dict: bool | None = None, **kwargs) -> SequenceClassifierOutput:
        """Args:
            input_ids: (B, L) ids, right-padded.
            attention_mask: (B, L), ones then zeros (default: no padding).
            labels: (B,) class ids in [0, K).
            input_ids2, attention_mask2: the second documents of a two-tower classifier.
            inputs_embeds: refused. return_dict, **kwargs: ignored.

        Returns:
            ``logits`` (B, K) and ``loss`` with labels.

        Raises:
            ValueError: on ``inputs_embeds``, a mask that is not ones then zeros, and as
                :meth:`EncoderClassifier.forward`.
        """
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("SPEForSequenceClassification reads token ids: pass input_ids, not inputs_embeds")
        logits = self.model(input_ids, _lengths(attention_mask, "attention_mask"), input_ids2,
                            _lengths(attention_mask2, "attention_mask2"))
        loss = None if labels is None else cross_entropy(logits, labels.to(logits.device))
        return SequenceClassifierOutput(loss=loss, logits=logits)


def _lengths(mask: Tensor | None, name: str) -> Tensor | None:
    """(B,) lengths of a right-padding mask (ones, then zeros), None without one."""
    if mask is None:
        return None
    lengths = mask.long().sum(-1)
    expected = torch.arange(mask.shape[-1], device=mask.device)[None, :] < lengths[:, None]
    if not torch.equal(mask.bool(), expected):
        raise ValueError(f"{name} must be ones then zeros (right padding) in each row")
    return lengths
