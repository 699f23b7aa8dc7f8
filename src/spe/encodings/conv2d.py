"""2-D convSPE: a relative kernel over an image grid from filtered 2-D noise, eq. (22) of Liutkus et al. 2021.

Letters: Y × X = grid height × width, L = Y·X (positions read row-major), H = num_heads,
D = head_dim, R = num_realizations, P1 × P2 = kernel_size, c = ((P1 − 1) // 2, (P2 − 1) // 2).

Orientation (centred, non-causal: an image has no past):
    Q̄_d(x) = Σ_a Φ^Q_d(a) Z_d(x + a − c),   K̄_d(x) = Σ_a Φ^K_d(a) Z_d(x + a − c),
with x, a 2-D indices and Z_d i.i.d. N(0, 1) on the grid extended by c before and P − 1 − c
after each axis, so every position sees a full window of noise. Then for the 2-D offset τ = m − n
    P_d(τ) = E[Q̄_d(m) K̄_d(n)] = Σ_a Φ^Q_d(a) Φ^K_d(a + τ)   (terms with 0 ≤ a + τ < P),
which depends on the offset only and vanishes when |τ_1| ≥ P1 or |τ_2| ≥ P2.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spe.encodings.code import DenseCode
from spe.encodings.positions import check_code_seed, code_generator, require_positive
from spe.encodings.conv import ConvOptions
from spe.encodings.filter import SPEOptions, build_filter
from spe.encodings.spec import KeepsFullPrecision, PositionalSpec, head_dim

__all__ = ["ConvSPE2d", "filter_noise_2d", "filter_noise_2d_direct", "SPEC"]


def _check(z: Tensor, filters: Tensor) -> tuple[int, int]:
    if z.dim() != 5 or filters.dim() != 4 or z.shape[2:4] != filters.shape[:2]:
        raise ValueError(f"filter_noise_2d: expected noise (Y+P1−1, X+P2−1, H, D, R) and filters "
                         f"(H, D, P1, P2) with the same H, D; got {tuple(z.shape)} and "
                         f"{tuple(filters.shape)}")
    height, width = z.shape[0] - filters.shape[2] + 1, z.shape[1] - filters.shape[3] + 1
    if height < 1 or width < 1:
        raise ValueError(f"filter_noise_2d: noise {tuple(z.shape[:2])} is smaller than the filter "
                         f"{tuple(filters.shape[2:])}")
    return height, width


def filter_noise_2d(z: Tensor, filters: Tensor) -> Tensor:
    """Σ_a Φ_d(a) Z_d(y + a) for every grid position, in the frequency domain (O(N log N)).

    Args:
        z: (Y + P1 − 1, X + P2 − 1, H, D, R) noise on the extended grid.
        filters: (H, D, P1, P2) filters Φ.

    Returns:
        (Y·X, H, D, R) codes, positions row-major.

    Raises:
        ValueError: on mismatched shapes.
    """
    height, width = _check(z, filters)
    size = z.shape[:2]
    zf = torch.fft.rfft2(z.permute(2, 3, 4, 0, 1), s=size)  # (H, D, R, F1, F2)
    # A cross-correlation is a product with the conjugate spectrum; the circular wrap only
    # reaches outputs at y ≥ Y or x ≥ X, which are cut.
    ff = torch.fft.rfft2(filters, s=size).conj()[:, :, None]  # (H, D, 1, F1, F2)
    y = torch.fft.irfft2(zf * ff, s=size)[..., :height, :width]  # (H, D, R, Y, X)
    return y.permute(3, 4, 0, 1, 2).reshape(height * width, *z.shape[2:])


def filter_noise_2d_direct(z: Tensor, filters: Tensor) -> Tensor:
    """Reference twin of :func:`filter_noise_2d` with ``conv2d`` (a cross-correlation), O(N·P1·P2)."""
    height, width = _check(z, filters)
    h, d, r = z.shape[2:]
    x = z.permute(4, 2, 3, 0, 1).reshape(r, h * d, *z.shape[:2])  # (R, H·D, Y+P1−1, X+P2−1)
    y = F.conv2d(x, filters.reshape(h * d, 1, *filters.shape[2:]), groups=h * d)  # (R, H·D, Y, X)
    return y.view(r, h, d, height * width).permute(3, 1, 2, 0)


def _pair(owner: str, name: str, value, *, square: bool) -> tuple:
    """(a, b) from a pair, or from one value when ``square``; the sizes themselves are checked by
    :func:`require_positive`."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return tuple(value)
    if square and not isinstance(value, (tuple, list)):
        return value, value
    either = "an int or " if square else ""
    raise ValueError(f"{owner}: {name} must be {either}a pair (height, width), got {value!r}")


class ConvSPE2d(KeepsFullPrecision):
    """Convolutional SPE over an Y × X grid (eq. 22 with a 2-D filter), for images read row-major.

    Args:
        num_heads: H.
        head_dim: D.
        num_realizations: R, default noise realisations per draw.
        kernel_size: P1 × P2 filter size in pixels (an int for a square); the kernel vanishes
            beyond offsets of P1 − 1 rows or P2 − 1 columns.
        impl: ``fft`` (:func:`filter_noise_2d`), ``direct`` (:func:`filter_noise_2d_direct`) or
            ``auto`` (fft when P1·P2 ≥ 64). Same numbers either way.
        code_seed: seed of the code drawn in eval mode without a ``generator`` (default 0):
            in ``eval()`` every call draws the same code; in training mode each call a new one.

    Raises:
        ValueError: if a size is not a positive integer or ``impl`` is unknown.
    """

    def __init__(self, num_heads: int, head_dim: int, num_realizations: int = 64,
                 kernel_size: int | tuple[int, int] = 8, *, impl: str = "auto", code_seed: int = 0) -> None:
        super().__init__()
        self.code_seed = check_code_seed("ConvSPE2d", code_seed)
        if impl not in ("auto", "fft", "direct"):
            raise ValueError(f"ConvSPE2d: impl must be 'auto', 'fft' or 'direct', got {impl!r}")
        p1, p2 = _pair("ConvSPE2d", "kernel_size", kernel_size, square=True)
        require_positive("ConvSPE2d", num_heads=num_heads, head_dim=head_dim,
                         num_realizations=num_realizations, kernel_size_rows=p1, kernel_size_cols=p2)
        self.impl = impl
        self.num_heads, self.head_dim = num_heads, head_dim
        self.num_realizations, self.kernel_size = num_realizations, (p1, p2)
        # A centred bump of unit norm: P_d(0) = 1, decaying with the offset in both directions;
        # a little noise breaks the symmetry between Φ^Q and Φ^K.
        axes = [torch.arange(p, dtype=torch.float32) - (p - 1) // 2 for p in (p1, p2)]
        bump = torch.exp(-(axes[0][:, None].abs() / max(p1 / 4, 1) + axes[1][None, :].abs() / max(p2 / 4, 1)))
        base = (bump / bump.norm()).expand(num_heads, head_dim, p1, p2)
        scale = 0.01 / (p1 * p2) ** 0.5
        self.filters_q = nn.Parameter(base + scale * torch.randn(base.shape))
        self.filters_k = nn.Parameter(base + scale * torch.randn(base.shape))

    def forward(self, grid: tuple[int, int], *, num_realizations: int | None = None,
                generator: torch.Generator | None = None) -> DenseCode:
        """Draws one code Q̄, K̄ over a Y × X grid.

        Args:
            grid: (Y, X), the grid's height and width in positions.
            num_realizations: R for this draw (default: the constructor's).
            generator: source of the noise Z and the gating noise ε (drawn on the CPU, then moved);
                default: in eval mode one seeded with ``code_seed`` (the same code at every
                call), in training mode PyTorch's default generator.

        Returns:
            A :class:`DenseCode` with qbar, kbar (Y·X, H, D, R), row-major, and gate_noise (H, D, R).
            The noise alone holds (Y + P1 − 1)(X + P2 − 1)·H·D·R values (100 MB in float32 for
            32 × 32 pixels, P = 8, H·D = 256, R = 64).

        Raises:
            ValueError: if the grid is not a pair, or its sizes or R are not positive integers.
        """
        height, width = _pair("ConvSPE2d", "grid", grid, square=False)
        r = self.num_realizations if num_realizations is None else num_realizations
        require_positive("ConvSPE2d", height=height, width=width, num_realizations=r)
        (p1, p2), h, d = self.kernel_size, self.num_heads, self.head_dim
        generator = code_generator(self, generator)
        like = dict(device=self.filters_q.device, dtype=self.filters_q.dtype)
        z = torch.randn(height + p1 - 1, width + p2 - 1, h, d, r, generator=generator).to(**like)
        eps = torch.randn(h, d, r, generator=generator).to(**like)
        apply = filter_noise_2d if self.impl == "fft" or (self.impl == "auto" and p1 * p2 >= 64) \
            else filter_noise_2d_direct
        return DenseCode(qbar=apply(z, self.filters_q), kbar=apply(z, self.filters_k), gate_noise=eps)

    def kernel(self, offsets: Tensor) -> Tensor:
        """Exact expected kernel E[Q̄_d(m) K̄_d(n)] / R for 2-D offsets m − n.

        Args:
            offsets: (T, 2) integer (row, column) offsets.

        Returns:
            (H, D, T) values Σ_a Φ^Q_d(a) Φ^K_d(a + offset); zero where |offset_i| ≥ P_i.

        Raises:
            ValueError: if offsets is not (T, 2).
        """
        offsets = torch.as_tensor(offsets, device=self.filters_q.device).long()
        if offsets.dim() != 2 or offsets.shape[1] != 2:
            raise ValueError(f"ConvSPE2d.kernel: offsets must be (T, 2), got {tuple(offsets.shape)}")
        (p1, p2) = self.kernel_size
        rows = torch.arange(p1, device=offsets.device)[None, :] + offsets[:, :1]  # (T, P1): rows of Φ^K
        cols = torch.arange(p2, device=offsets.device)[None, :] + offsets[:, 1:]  # (T, P2)
        valid = ((rows >= 0) & (rows < p1))[:, :, None] & ((cols >= 0) & (cols < p2))[:, None, :]
        fk = self.filters_k[:, :, rows.clamp(0, p1 - 1)[:, :, None], cols.clamp(0, p2 - 1)[:, None, :]]
        return (self.filters_q[:, :, None] * fk * valid).sum((-2, -1))  # (H, D, T)


SPEC = PositionalSpec("convspe-2d", "queries-keys", stochastic=True, needs_grid=True,
                      source="Liutkus et al. 2021, eq. (22) with a 2-D filter (images)",
                      model_module=lambda c: ConvSPE2d(c.num_heads, head_dim(c), c.num_realizations, c.kernel_size),
                      layer_module=build_filter, options=(SPEOptions, ConvOptions))
