"""The trunk every model shares: token embedding, positional modules, blocks, final norm.

Letters: B = batch, L = length, C = d_model, H = num_heads, D = head_dim,
R = num_realizations, Y × X = image grid.

    x = drop(embed(tokens) · s (+ APE)) → N × Block (codes drawn once per pass) → LayerNorm

:class:`Trunk` is the base class of both heads: :class:`~spe.models.DecoderLM` (causal blocks
and a next-token head) and :class:`~spe.models.EncoderClassifier` (bidirectional blocks,
pooling and an MLP head). The heads subclass the trunk rather than hold it, so parameter names
stay ``embed.*``, ``encoding.*``, ``blocks.N.*``, ``norm.*``, ``head.*`` and checkpoints written
before the trunk existed load unchanged. Token ids are checked here once for both heads
(:func:`check_in_range`): one host read on the CPU, none on CUDA.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spe.encodings.code import DenseCode, SPECode
from spe.encodings.registry import positional_spec
from spe.encodings.oracle import alias_gate_keys, unalias_gate_keys
from spe.models.block import Block
from spe.models.positional import positional_modules

__all__ = ["Trunk", "check_in_range", "check_token_ids", "init_weights"]


def check_in_range(values: Tensor, low: int, high: int, describe: Callable[[int, int], str], *,
                   asynchronous: bool | None = None) -> None:
    """Checks that every value lies in [low, high] (both included), without stalling a GPU.

    On the CPU the minimum and maximum are read in one transfer and a violation raises
    ``ValueError(describe(min, max))``. On CUDA a device-side assertion is queued instead
    (``torch._assert_async``): no host synchronisation; a violation surfaces as a CUDA error
    carrying ``describe``'s text for the bounds at the next synchronisation. Other devices
    take the CPU path (one read), as not all of them implement the assertion.

    Args:
        values: integer tensor of any shape (empty: nothing to check).
        low, high: inclusive bounds.
        describe: ``(min, max) -> message``; on CUDA called with (low, high).
        asynchronous: force the assertion (True) or the read (False); None: by device.

    Raises:
        ValueError: on the read path, if a value lies outside [low, high].
        RuntimeError: on the assertion path on the CPU (CUDA reports it asynchronously).
    """
    if not values.numel():
        return
    if asynchronous is None:
        asynchronous = values.device.type == "cuda"
    if asynchronous:
        torch._assert_async(((values >= low) & (values <= high)).all(), describe(low, high))
        return
    lo, hi = torch.stack(torch.aminmax(values)).tolist()  # the one host read
    if lo < low or hi > high:
        raise ValueError(describe(lo, hi))


def check_token_ids(tokens: Tensor, vocab_size: int) -> None:
    """Raises ValueError ``token ids must lie in [0, V), got [min, max]`` (V = ``vocab_size``)
    unless every id of ``tokens`` (any shape) lies in [0, V); see :func:`check_in_range`."""
    check_in_range(tokens, 0, vocab_size - 1,
                   lambda lo, hi: f"token ids must lie in [0, {vocab_size}), got [{lo}, {hi}]")


def init_weights(module: nn.Module) -> None:
    """GPT-2's initialisation: N(0, 0.02²) weights of linear layers and embeddings, zero biases
    (norms and positional modules keep their own)."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)


class Trunk(nn.Module):
    """Embedding, positional modules from the registry, N blocks and the final norm.

    One SPE code is drawn per forward pass and shared by all examples of the batch, and (with
    ``config.share_across_layers``) by all layers, each layer keeping its own gate (appendix
    A.2 of Liutkus et al. 2021); otherwise every layer has its own encoding and code. In
    training mode the code comes from the ``generator`` passed in (or PyTorch's default
    generator); in eval mode from a generator seeded with ``config.code_seed``, so the same
    checkpoint and input give the same outputs.

    Subclasses (the heads) implement :meth:`build_head`; it is called after the trunk's modules
    are built and before the weights are initialised, the order that fixes which random
    numbers each parameter gets.

    Args:
        config: a :class:`~spe.models.TrunkConfig` (or any object with its fields).
        causal: blocks mask the future (decoder) or not (encoder).
        grid: (Y, X) of images read row-major, for grid encodings (``convspe-2d``); None for
            sequences.
        prefix: positions before the grid that have no place on it (a CLS token): their code
            rows are zero.
    """

    def __init__(self, config, *, causal: bool, grid: tuple[int, int] | None = None, prefix: int = 0) -> None:
        super().__init__()
        self.config = config
        self.spec = positional_spec(config.positional)
        self.grid, self.prefix = grid, prefix
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        pe = positional_modules(config, self.spec)
        self.embed_scale = pe.embed_scale
        self.ape: nn.Module | None = pe.ape
        # The first layer's encoding (the only one when shared) keeps the name ``encoding`` so
        # that checkpoints of shared models load unchanged.
        self.encoding: nn.Module | None = pe.encoding
        self.layer_encodings: nn.ModuleList | None = pe.layer_encodings
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, causal=causal) for _ in range(config.num_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.head = self.build_head()
        self.apply(init_weights)
        if self.encoding is not None and not self.spec.stochastic:
            self._bind_exact_scores()

    def _bind_exact_scores(self) -> None:
        """An SPE oracle (``sinespe-exact``): each layer's score term reads its layer's SPE kernel,
        and the state dict names the gates as SPE's filters do, so checkpoints load either way."""
        for i, block in enumerate(self.blocks):
            block.attn.score_encoding.bind(self.layer_encoding(i))
        self.register_state_dict_post_hook(alias_gate_keys)
        self.register_load_state_dict_pre_hook(unalias_gate_keys)

    def build_head(self) -> nn.Module:
        """The head on top of the (B, L, C) final-norm states; implemented by each model."""
        raise NotImplementedError(f"{type(self).__name__} must define build_head()")

    def num_parameters(self) -> int:
        """Number of parameters (a tied head counted once)."""
        return sum(p.numel() for p in self.parameters())

    def layer_encoding(self, layer: int) -> nn.Module | None:
        """The SPE module (``SineSPE``/``ConvSPE``) of block ``layer`` (0-based; None without SPE;
        an oracle's too)."""
        if self.layer_encodings is None or layer == 0:
            return self.encoding
        return self.layer_encodings[layer - 1]

    @torch.no_grad()
    def redraw_features(self, generator: torch.Generator | None = None) -> None:
        """Redraws every layer's FAVOR+ random features (no-op for other kernels)."""
        for block in self.blocks:
            block.attn.redraw_features(generator)

    def check_tokens(self, tokens: Tensor) -> None:
        """Raises ValueError unless ``tokens`` is (B, L) with ids in [0, V) (see :func:`check_token_ids`)."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, length), got shape {tuple(tokens.shape)}")
        check_token_ids(tokens, self.config.vocab_size)

    def draw_codes(self, positions: Tensor | int, *, generator: torch.Generator | None = None,
                   num_realizations: int | None = None) -> list[SPECode | None]:
        """Draws the SPE code of every block.

        Shared encodings draw once and give every block the same code; per-layer encodings
        draw in block order from the same generator. The noise does not depend on the length,
        so a prefix gets the same codes whatever follows it (needed by recurrent decoding),
        and a real position the same code however much padding follows.

        Args:
            positions: (L,) positions (real-valued for ``sinespe``), or L for 0 … L − 1. A grid
                encoding takes only their number: ``prefix`` + Y·X.
            generator: source of the noise (default: ``config.code_seed`` in eval mode,
                PyTorch's default generator in training mode); ignored with
                ``config.fixed_code``, which always draws from ``config.code_seed``.
            num_realizations: R for this pass (default: the config's).

        Returns:
            num_layers codes (all None without SPE).

        Raises:
            ValueError: if a grid encoding gets a length other than ``prefix`` + Y·X.
        """
        if not isinstance(positions, Tensor):
            positions = torch.arange(int(positions), device=self.embed.weight.device)
        if self.encoding is None or not self.spec.stochastic:  # an oracle draws nothing
            return [None] * len(self.blocks)
        if self.config.fixed_code or (generator is None and not self.training):
            generator = torch.Generator().manual_seed(self.config.code_seed)
        if self.layer_encodings is None:
            return [self._code(self.encoding, positions, generator, num_realizations)] * len(self.blocks)
        return [self._code(self.layer_encoding(i), positions, generator, num_realizations)
                for i in range(len(self.blocks))]

    def _code(self, encoding: nn.Module, positions: Tensor, generator: torch.Generator | None,
              num_realizations: int | None) -> SPECode:
        if not self.spec.needs_grid:
            return encoding(positions=positions, generator=generator, num_realizations=num_realizations)
        if self.grid is None:
            raise ValueError(f"positional {self.config.positional!r} encodes a 2-D grid: this model has none")
        (rows, cols), length = self.grid, positions.shape[0]
        if length - self.prefix != rows * cols:
            raise ValueError(f"positional {self.config.positional!r} encodes a {rows} × {cols} grid: sequences "
                             f"must hold {rows * cols} tokens, got {length - self.prefix}")
        code = encoding(grid=(rows, cols), generator=generator, num_realizations=num_realizations)
        if not self.prefix:
            return code
        # Prefix tokens (CLS) have no grid position: zero code rows (see EncoderClassifier).
        pad = (0, 0, 0, 0, 0, 0, self.prefix, 0)
        return DenseCode(qbar=F.pad(code.qbar, pad), kbar=F.pad(code.kbar, pad), gate_noise=code.gate_noise)

    def embed_tokens(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """(B, L) ids at (L,) positions → (B, L, C) embeddings · s (+ the token encoding), no dropout."""
        x = self.embed(tokens) * self.embed_scale
        return x if self.ape is None else self.ape(x, positions)

    def hidden(self, tokens: Tensor, positions: Tensor, *, key_padding_mask: Tensor | None = None,
               generator: torch.Generator | None = None, num_realizations: int | None = None,
               times: Tensor | None = None) -> Tensor:
        """The trunk's forward pass on checked tokens (:meth:`check_tokens`).

        Args:
            tokens: (B, L) ids in [0, V).
            positions: (L,) positions shared by the batch; score encodings use index distances,
                so their blocks get none.
            key_padding_mask: (B, L) bool, True at padding (encoders only).
            generator, num_realizations: as :meth:`draw_codes`.
            times: (B, L) per-sequence times for the blocks' encodings (the onset clock's), or None.

        Returns:
            (B, L, C) final-norm hidden states.

        Raises:
            ValueError: from the positional modules (e.g. ``ape-learned`` positions beyond
                ``max_positions``, real-valued ``convspe`` positions) or :meth:`draw_codes`.
        """
        x = self.drop(self.embed_tokens(tokens, positions))  # (B, L, C)
        codes = self.draw_codes(positions, generator=generator, num_realizations=num_realizations)
        block_positions = None if self.spec.acts_on == "scores" else positions
        for block, code in zip(self.blocks, codes):
            x = block(x, code, block_positions, key_padding_mask=key_padding_mask, times=times)
        return self.norm(x)
