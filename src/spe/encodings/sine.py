"""sineSPE: periodic relative kernels from sinusoids and noise, eq. (18)-(21) of Liutkus et al. 2021,
in the token index, in a learned clock (``spe_time``, :class:`LearnedTimeSPEFilter`) or in the
music's onsets (:class:`OnsetSPEFilter`).

Letters: B = batch, L = length, C = d_model, H = num_heads, D = head_dim, R = num_realizations,
K = num_sines.

This module holds the encodings' parameters (frequencies, phases, gains, clocks) and draws the
codes; the code's application at per-sequence times is :mod:`spe.ops.sine.apply`
(:func:`apply_sine_code_timed`, :func:`apply_sine_code_timed_pair`) and its float64 twin
:func:`spe.ops.sine.naive.apply_sine_code_timed_reference`. Those three names are re-exported
here, where they were first public, for code that imports them from ``spe.encodings.sine``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from spe.encodings.clock import CLOCK_TIMES, LearnedClock
from spe.encodings.code import SineCode, SPECode
from spe.ops.sine.apply import apply_sine_code_timed, apply_sine_code_timed_pair
from spe.ops.sine.naive import apply_sine_code_timed_reference
from spe.ops.sine.phases import sine_phase
from spe.encodings.positions import (NOISE_DTYPE, check_code_seed, code_generator, require_positive,
                                     resolve_positions)
from spe.encodings.filter import SPEFilter, SPEOptions, _check, build_filter
from spe.encodings.spec import KeepsFullPrecision, PositionalSpec, head_dim, option

__all__ = ["CODE_NOISES", "FREQUENCY_INITS", "SPE_TIMES", "LearnedTimeSPEFilter", "OnsetSPEFilter", "SineOptions",
           "SineSPE", "TimedSPEFilter",
           "apply_sine_code_timed", "apply_sine_code_timed_pair", "apply_sine_code_timed_reference",
           "orthogonal_noise", "sine_phase",
           "SPEC"]

# the accepted values of SineSPE's ``noise`` and ``frequency_init`` (ModelConfig checks them too)
CODE_NOISES = ("gaussian", "orthogonal")
FREQUENCY_INITS = ("low", "spread")
# The times sineSPE's codes read: the clock's (index, learned) or the music's onsets (onset).
SPE_TIMES = (*CLOCK_TIMES, "onset")


def orthogonal_noise(num_heads: int, num_groups: int, group_size: int, num_realizations: int, *,
                     generator: torch.Generator | None = None) -> Tensor:
    """Variance-reduced noise with the second moments of i.i.d. N(0, 1) noise.

    Per head, the num_groups·group_size rows (each of length R) are filled in blocks of
    ⌊R / group_size⌋ whole groups; the rows of a block are orthogonal with norm exactly √R
    (rows of a Haar-random orthogonal matrix times √R). Blocks and heads are independent.
    Then E[z_i z_jᵀ] = R·δ_ij as for Gaussian rows, so every expected SPE kernel is
    unchanged, while within a group Z Zᵀ = R·I exactly: a feature's kernel estimate has no
    noise at all when group_size ≤ R (section 3.1 (i) of Liutkus et al. 2021 names this as
    future work).

    Returns:
        (H, num_groups, group_size, R).
    """
    per_block = max(1, num_realizations // group_size) * group_size
    rows = num_groups * group_size
    heads = []
    for _ in range(num_heads):
        blocks, filled = [], 0
        while filled < rows:
            q, r = torch.linalg.qr(torch.randn(num_realizations, num_realizations, generator=generator,
                                               dtype=torch.float64))
            q = q * torch.sign(torch.diagonal(r))  # Haar-distributed
            take = min(per_block, rows - filled, num_realizations)
            blocks.append(q[:take] * num_realizations**0.5)
            filled += take
        heads.append(torch.cat(blocks)[:rows])
    return torch.stack(heads).view(num_heads, num_groups, group_size, num_realizations).float()


class SineSPE(KeepsFullPrecision):
    """Sinusoidal stochastic positional encoding (sineSPE), eq. (18)-(21).

    Each feature d of each head carries the relative kernel

        P_d(τ) = (1 / 2K) Σ_k λ_dk² cos(2π f_dk τ + θ_dk),

    with learnable frequencies f ∈ [0, 1/2] cycles per position (higher ones alias on integer
    lags), phases θ (radians) and gains λ. Calling the module draws a code whose
    cross-covariance E[Q̄_d K̄_dᵀ] / R is exactly that kernel (see :meth:`kernel`).

    Args:
        num_heads: H.
        head_dim: D, the query/key dimension per head.
        num_realizations: R, the default number of noise realisations (may be overridden
            per call, e.g. at test time). Default 32, as
            :class:`~spe.models.ModelConfig` (tests keep them equal).
        num_sines: K, sinusoids per feature (default 5, as ModelConfig).
        frequency_init: ``"low"`` (the original code's choice: logits N(-4, 1), periods of
            roughly 100 positions) or ``"spread"`` (log-uniform periods from 2 to 1,024).
        noise: ``"gaussian"`` (i.i.d. N(0, 1), the paper) or ``"orthogonal"`` (variance
            reduced, see :func:`orthogonal_noise`): same expected kernel, and each feature's
            kernel estimate Q̄_d K̄_dᵀ / R is exact when 2K ≤ R.
        code_seed: seed of the code drawn in eval mode without a ``generator`` (default 0):
            in ``eval()`` every call draws the same code, so a layer using it is
            deterministic; in training mode each call draws a new one.

    Dtypes: the parameters stay float32 when the module (or a model holding it) is cast to
    bfloat16 or float16 (:class:`~spe.encodings.spec.KeepsFullPrecision`): rounded to bf16, the
    frequencies would put q̂ 90 % off float32 at positions 990-999. Phases are reduced in float64
    and the code is cast to the queries' dtype by the filter, so q̂ of a bf16 model is 0.3 % off
    float32 at any position, as under bf16 autocast with float32 weights (0.4 %).

    Raises:
        ValueError: if a size is not a positive integer (2.0 and True are refused too) or
            ``frequency_init`` is unknown.
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        num_realizations: int = 32,
        num_sines: int = 5,
        *,
        frequency_init: str = "low",
        noise: str = "gaussian",
        code_seed: int = 0,
    ) -> None:
        super().__init__()
        self.code_seed = check_code_seed("SineSPE", code_seed)
        if noise not in CODE_NOISES:
            raise ValueError(f"SineSPE: noise must be 'gaussian' or 'orthogonal', got {noise!r}")
        self.noise = noise
        require_positive("SineSPE", num_heads=num_heads, head_dim=head_dim,
                         num_realizations=num_realizations, num_sines=num_sines)
        self.num_heads, self.head_dim = num_heads, head_dim
        self.num_realizations, self.num_sines = num_realizations, num_sines
        shape = (num_heads, head_dim, num_sines)
        if frequency_init == "low":
            logits = torch.randn(shape) - 4.0
        elif frequency_init == "spread":
            periods = torch.exp(torch.empty(shape).uniform_(math.log(2.0), math.log(1024.0)))
            freqs = (1.0 / periods).clamp(1e-6, 0.5 - 1e-6)
            logits = torch.log(2 * freqs) - torch.log1p(-2 * freqs)
        else:
            raise ValueError(f"SineSPE: frequency_init must be 'low' or 'spread', got {frequency_init!r}")
        self.frequency_logits = nn.Parameter(logits)
        # θ = 0 and λ = √2 start every feature at P_d(0) = 1, a symmetric kernel that decays
        # from lag 0 (plain dot-product attention at lag 0).
        self.phases = nn.Parameter(torch.zeros(shape))
        self.gains = nn.Parameter(torch.full(shape, math.sqrt(2.0)))

    @property
    def frequencies(self) -> Tensor:
        """(H, D, K) frequencies in cycles per position, in [0, 1/2]."""
        return 0.5 * torch.sigmoid(self.frequency_logits)

    def forward(
        self,
        length: int | None = None,
        *,
        positions: Tensor | None = None,
        query_positions: Tensor | None = None,
        key_positions: Tensor | None = None,
        num_realizations: int | None = None,
        generator: torch.Generator | None = None,
    ) -> SineCode:
        """Draws one code.

        Give either ``length`` (positions 0 … length−1), ``positions`` (shared by queries
        and keys), or both ``query_positions`` and ``key_positions`` (e.g. decoding).
        Positions may be real-valued (continuous time); the kernel depends only on m − n.

        Args:
            length: number of positions.
            positions: (L,) positions.
            query_positions: (Lq,) positions of the queries.
            key_positions: (Lk,) positions of the keys.
            num_realizations: R for this draw (default: the constructor's).
            generator: source of the noise Z and ε (drawn on the CPU, then moved); default:
                in eval mode one seeded with ``code_seed`` (the same code at every call), in
                training mode PyTorch's default generator (a new code at every call).

        Returns:
            A :class:`SineCode` with omega_q (Lq, H, D, 2K), omega_k (Lk, H, D, 2K),
            weights (H, D, 2K, R), gate_noise (H, D, R).

        Raises:
            ValueError: on inconsistent or missing positions, or a length or R that is not a
                positive integer.
        """
        pos_q, pos_k = resolve_positions(length, positions, query_positions, key_positions,
                                         device=self.frequency_logits.device, owner="SineSPE")
        r = self.num_realizations if num_realizations is None else num_realizations
        require_positive("SineSPE", num_realizations=r)
        generator = code_generator(self, generator)
        h, d, k = self.num_heads, self.head_dim, self.num_sines
        dtype, device = self.frequency_logits.dtype, self.frequency_logits.device
        if self.noise == "orthogonal":
            z = orthogonal_noise(h, d, 2 * k, r, generator=generator).to(device=device, dtype=dtype)
            eps = orthogonal_noise(h, d, 1, r, generator=generator)[:, :, 0].to(device=device, dtype=dtype)
        else:
            # Drawn in float32 whatever the module's dtype, then cast: a float64 copy of a
            # checkpoint draws the same code from the same seed (to float32 rounding).
            z = torch.randn(h, d, 2 * k, r, generator=generator, dtype=NOISE_DTYPE).to(device=device, dtype=dtype)
            eps = torch.randn(h, d, r, generator=generator, dtype=NOISE_DTYPE).to(device=device, dtype=dtype)
        gains = self.gains.repeat_interleave(2, dim=-1)  # λ̈: (H, D, 2K)
        weights = gains[..., None] * z / math.sqrt(2 * k)
        return SineCode(frequencies=self.frequencies, phases=self.phases, query_positions=pos_q,
                        key_positions=pos_k, weights=weights, gate_noise=eps)

    def kernel(self, lags: Tensor) -> Tensor:
        """Exact expected kernel E[Q̄_d(m) K̄_d(n)] / R for m − n = lag, eq. (18) / (2K).

        Args:
            lags: (T,) integer or real lags m − n.

        Returns:
            (H, D, T) kernel values, with the normalisation of the sampled codes, so that the
            Monte-Carlo mean of Q̄ K̄ᵀ / R converges to it at the 1/√R rate.
        """
        lags = torch.as_tensor(lags, device=self.frequency_logits.device)
        angle = sine_phase(self.frequencies, lags).permute(1, 2, 0, 3) + self.phases[:, :, None]
        return (self.gains[:, :, None] ** 2 * torch.cos(angle)).sum(-1) / (2 * self.num_sines)


class TimedSPEFilter(SPEFilter):
    """The SPE filter whose code's sinusoids are read at per-sequence times τ (B, L, H), the
    context :meth:`prepare` gives (:class:`LearnedTimeSPEFilter`, :class:`OnsetSPEFilter`), so that
    E[q̂_m·k̂_n] = Σ_d q_d k_d P_d(τ_m − τ_n). Takes :class:`~spe.encodings.code.SineCode` s only."""

    time_name, clock_name = "time", "clock's times"  # how messages name the time and what sets it
    prepare_call = "times, _ = f.prepare(x, positions)"  # how a message shows the times being made

    def forward(self, queries: Tensor, keys: Tensor, code: SPECode, *,
                context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """q̂, k̂ (B, L, H, R) at the times ``context`` (B, L, H) that :meth:`prepare` gives
        (:meth:`encode_queries_keys`).

        Raises:
            ValueError: without ``context``: the plain ``(queries, keys, code)`` call of
                :class:`~spe.encodings.filter.SPEFilter` would read the token index instead of the
                times, silently, and train nothing of the clock; and as :meth:`encode_queries_keys`.
        """
        if context is None:
            raise ValueError(f"{type(self).__name__} reads sinusoids at the {self.clock_name}, not the token "
                             f"index: call {self.prepare_call}, then f(queries, keys, code, context=times), "
                             f"as spe.MultiHeadAttention does")
        return self.encode_queries_keys(queries, keys, code=code, context=context)

    def encode_queries_keys(self, q: Tensor, k: Tensor, *, code: SPECode,
                            context: Tensor) -> tuple[Tensor, Tensor]:
        """q̂, k̂ (B, L, H, R) of q, k (B, L, H, D) under a sineSPE ``code`` read at times ``context``
        (B, L, H) (:meth:`prepare`).

        Raises:
            ValueError: for a code that is not a sineSPE code, or shapes that do not match it.
        """
        if not isinstance(code, SineCode):
            raise ValueError(f"sineSPE in {self.time_name} reads sinusoids at the {self.clock_name}: it takes a "
                             f"SineCode, got {type(code).__name__}")
        _check(q, k, code, self.num_heads, self.head_dim)
        gate = self.gate
        return apply_sine_code_timed_pair(q, k, code.frequencies, code.phases, context, code.weights, gate,
                                          code.gate_noise)


class OnsetSPEFilter(TimedSPEFilter):
    """sineSPE on the music's onset clock: the code's sinusoids read at τ_m = s · onset_m, the
    onset of token m in beats (:mod:`spe.encodings.onset`, computed by the model from the
    tokens) times a fixed scale s (the corpus's mean tokens per beat), the same τ for every head:

        E[q̂_m·k̂_n] = Σ_d q_d k_d P_d(s·(onset_m − onset_n))

    (eq. (18)'s kernel, stationary in musical time; relative attention over onsets as Moonbeam's).
    The deterministic ablation between ``index`` and ``learned``: no parameter of its own. The
    model gives the times as the call's positions (B, L); decoding carries the running bar and
    position in the model's :class:`~spe.models.DecodingState`, so the layer keeps no state.
    Costs as :class:`LearnedTimeSPEFilter` without the clock's C·H per position.

    Args:
        num_heads, head_dim, gated, gate_init: as :class:`~spe.encodings.filter.SPEFilter`.

    Raises:
        ValueError: as :class:`~spe.encodings.filter.SPEFilter`.
    """

    time_name, clock_name = "onset time", "onsets"
    prepare_call = ("times, _ = f.prepare(x, onsets) with onsets (batch, length) = onset_scale × "
                    "spe.encodings.onset.remi_onsets(tokens, vocab)")

    def prepare(self, x: Tensor, positions: Tensor | None, state=None, *,
                key_padding_mask: Tensor | None = None) -> tuple[Tensor, None]:
        """τ (B, L, H) float64 from the per-sequence times ``positions`` (B, L), and no state.

        Raises:
            ValueError: if ``positions`` are not (B, L) like x's first two dimensions (the model
                gives them; a layer called alone has no onsets).
        """
        if positions is None or tuple(positions.shape) != tuple(x.shape[:2]):
            got = None if positions is None else tuple(positions.shape)
            raise ValueError(f"sineSPE on the onset clock reads per-sequence times (batch, length) = "
                             f"{tuple(x.shape[:2])} that the model computes from the tokens, got positions {got}")
        return positions.double()[..., None].expand(-1, -1, self.num_heads), None


class LearnedTimeSPEFilter(TimedSPEFilter):
    """sineSPE in learned time: the SPE filter with a :class:`~spe.encodings.clock.LearnedClock`.

    The code's sinusoids are read at each head's clock τ_m = Σ_{0<t≤m} Δ_t, Δ_t =
    softplus(w_hᵀ x_t + b_h), instead of the index m, so that

        E[q̂_m·k̂_n] = Σ_d q_d k_d P_d(τ_m − τ_n)

    (eq. (18)'s kernel, stationary in the clock, Liutkus et al. 2021; our extension). At the
    start (w = 0, b = softplus⁻¹(1)) τ_m = m: index sineSPE, the same code giving the same
    output. The clock reads the layer's input, so the code becomes per sequence: q̂, k̂ cost
    B·L·H·D·2K·R multiply-adds, the features formed in blocks of positions and again in
    backward (:func:`apply_sine_code_timed_pair`), where index sineSPE forms one (L, H, D, R) code for the
    batch; the clock adds C·H per position. Causal (τ_m reads x_{≤m}); decoding carries τ of the
    last position (B, H) float64 in the layer's :class:`~spe.encodings.spec.EncodingState`.
    Takes :class:`~spe.encodings.code.SineCode` s (sineSPE's) only.

    Args:
        num_heads, head_dim, gated, gate_init: as :class:`~spe.encodings.filter.SPEFilter`.
        d_model: C, the size of the layer's input the clock reads.

    Raises:
        ValueError: as :class:`~spe.encodings.filter.SPEFilter` and
            :class:`~spe.encodings.clock.LearnedClock`.
    """

    stateful = True

    def __init__(self, num_heads: int, head_dim: int, d_model: int, *, gated: bool = False,
                 gate_init: float = 0.0) -> None:
        super().__init__(num_heads, head_dim, gated=gated, gate_init=gate_init)
        self.clock = LearnedClock(d_model, num_heads)

    def prepare(self, x: Tensor, positions: Tensor | None, state: Tensor | None = None, *,
                key_padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The clock's times τ (B, L, H) of x (B, L, C) going on from ``state`` (B, H) (None: the
        start), and τ of the last position; ``positions`` are not read (the clock replaces them)."""
        return self.clock(x, state, key_padding_mask=key_padding_mask)

    time_name = "learned time"
    prepare_call = "times, state = f.prepare(x, None) with x (batch, length, d_model) the layer's input"


# The onset clock's largest scale, in tokens per beat: a beat of REMI holds a few dozen tokens; far
# larger scales are a damaged header (1e308 turned every time into inf, every score into NaN).
MAX_ONSET_SCALE = 1e6


@dataclass(kw_only=True)
class SineOptions:
    """sineSPE's own options (with :class:`~spe.encodings.filter.SPEOptions`).

    Attributes:
        num_sines: K, sinusoids per feature.
        frequency_init: ``low`` or ``spread`` initial frequencies.
        code_noise: ``gaussian`` or ``orthogonal`` (variance-reduced) noise.
        spe_time: the time the codes' sinusoids read: ``index`` (the token index m, eq. (19)),
            ``learned`` (a clock per head from each layer's input, :class:`LearnedTimeSPEFilter`)
            or ``onset`` (music: the onsets of the REMI tokens, :class:`OnsetSPEFilter`); read by
            ``sinespe`` only, like the other options of one encoding.
        onset_scale: s > 0, the onset clock's tokens per beat (``spe_time="onset"``: set by
            ``spe train`` from the training split, :func:`~spe.encodings.onset.tokens_per_beat`,
            and kept in checkpoints so evaluation and generation read the same clock).
        onset_tokens: the onset clock's REMI tokens, token string → id
            (:func:`~spe.encodings.onset.onset_tokens`), set with ``onset_scale``.
    """

    num_sines: int = option(5, "K, sinusoids per feature (sinespe)", flag_type=int)
    frequency_init: str = "low"
    code_noise: str = "gaussian"
    spe_time: str = option("index", "the time sinespe's codes read: index (default), learned (a clock "
                           "τ_m = Σ Δ_t, Δ_t = softplus(wᵀx_t + b) per head, from each layer's input) or onset "
                           "(music: each REMI token's onset in beats times the corpus's mean tokens per beat)",
                           flag_type=str, choices=SPE_TIMES)
    onset_scale: float = 0.0
    onset_tokens: dict | None = None

    def check_options(self) -> None:
        """Raises ValueError on K that is not a positive integer or an unknown choice."""
        require_positive(type(self).__name__, num_sines=self.num_sines)
        for name, allowed in (("code_noise", CODE_NOISES), ("frequency_init", FREQUENCY_INITS),
                              ("spe_time", SPE_TIMES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if isinstance(self.onset_scale, bool) or not isinstance(self.onset_scale, (int, float)) \
                or not math.isfinite(self.onset_scale) or not 0 <= self.onset_scale <= MAX_ONSET_SCALE:
            raise ValueError(f"onset_scale must be a number in [0, {MAX_ONSET_SCALE:g}] (tokens per beat; 0: not "
                             f"set), got {self.onset_scale!r}")
        if self.onset_tokens is not None and not isinstance(self.onset_tokens, dict):
            raise ValueError(f"onset_tokens must be a dict of REMI token → id, got {type(self.onset_tokens).__name__}")
        if self.onset_tokens is not None:  # checked with the config, so a loader names the checkpoint
            from spe.encodings.onset import onset_tokens

            onset_tokens(self.onset_tokens)
        if self.spe_time == "onset" and self.positional == "sinespe" and not type(self).causal:
            raise ValueError(f"spe_time 'onset' reads the onsets of a music language model's tokens: "
                             f"{type(self).__name__} is an encoder, which has none")


def build_sine(config) -> SineSPE:
    """The model's sineSPE code generator from a model config (R, K, frequency init, noise)."""
    return SineSPE(config.num_heads, head_dim(config), config.num_realizations, config.num_sines,
                   frequency_init=config.frequency_init, noise=config.code_noise)


def build_sine_filter(config, causal: bool) -> SPEFilter:
    """The per-layer filter of sineSPE: :func:`~spe.encodings.filter.build_filter`'s, or in learned
    time (``spe_time``) a :class:`LearnedTimeSPEFilter` with its clock."""
    if getattr(config, "spe_time", "index") == "index":
        return build_filter(config, causal)
    if config.spe_time == "onset":
        return OnsetSPEFilter(config.num_heads, head_dim(config), gated=config.gated, gate_init=config.gate_init)
    return LearnedTimeSPEFilter(config.num_heads, head_dim(config), config.d_model, gated=config.gated,
                                gate_init=config.gate_init)


SPEC = PositionalSpec("sinespe", "queries-keys", stochastic=True, windowed_by_default=True,
                      source="Liutkus et al. 2021, eq. (18)-(21)", model_module=build_sine,
                      layer_module=build_sine_filter, options=(SPEOptions, SineOptions))
