"""sineSPE: periodic relative kernels from sinusoids and noise, eq. (18)-(21) of Liutkus et al. 2021.

Letters: L = length, H = num_heads, D = head_dim, R = num_realizations, K = num_sines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from spe.encodings.code import SineCode
from spe.ops.phases import sine_phase
from spe.encodings.positions import (NOISE_DTYPE, check_code_seed, code_generator, require_positive,
                                     resolve_positions)
from spe.encodings.filter import SPEOptions, build_filter
from spe.encodings.spec import PositionalSpec, head_dim, option

__all__ = ["CODE_NOISES", "FREQUENCY_INITS", "SineOptions", "SineSPE", "orthogonal_noise", "sine_phase", "SPEC"]

# the accepted values of SineSPE's ``noise`` and ``frequency_init`` (ModelConfig checks them too)
CODE_NOISES = ("gaussian", "orthogonal")
FREQUENCY_INITS = ("low", "spread")


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


class SineSPE(nn.Module):
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


@dataclass(kw_only=True)
class SineOptions:
    """sineSPE's own options (with :class:`~spe.encodings.filter.SPEOptions`).

    Attributes:
        num_sines: K, sinusoids per feature.
        frequency_init: ``low`` or ``spread`` initial frequencies.
        code_noise: ``gaussian`` or ``orthogonal`` (variance-reduced) noise.
    """

    num_sines: int = option(5, "K, sinusoids per feature (sinespe)", flag_type=int)
    frequency_init: str = "low"
    code_noise: str = "gaussian"

    def check_options(self) -> None:
        """Raises ValueError on K that is not a positive integer or an unknown choice."""
        require_positive(type(self).__name__, num_sines=self.num_sines)
        for name, allowed in (("code_noise", CODE_NOISES), ("frequency_init", FREQUENCY_INITS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")


def build_sine(config) -> SineSPE:
    """The model's sineSPE code generator from a model config (R, K, frequency init, noise)."""
    return SineSPE(config.num_heads, head_dim(config), config.num_realizations, config.num_sines,
                   frequency_init=config.frequency_init, noise=config.code_noise)


SPEC = PositionalSpec("sinespe", "queries-keys", stochastic=True, windowed_by_default=True,
                      source="Liutkus et al. 2021, eq. (18)-(21)", model_module=build_sine, layer_module=build_filter,
                      options=(SPEOptions, SineOptions))
