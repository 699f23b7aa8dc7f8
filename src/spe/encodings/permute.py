"""PermuteFormer (Chen 2021, EMNLP): position as powers of a random feature permutation.

Letters: B = batch, L = length, H = num_heads, M = the kernel's feature dimension.

Each head h has a fixed random permutation P_h of its M feature indices; at position m the
features φ(x_m) are permuted m times:

    φ(q_m) → P^m φ(q_m),   φ(k_n) → P^n φ(k_n),   (P^m φ(q))ᵀ(P^n φ(k)) = φ(q)ᵀ P^(n−m) φ(k),

which depends on the lag only (P is orthogonal). Permuted features stay non-negative, so
numerator and normaliser are permuted alike and every linear kernel takes it, ReLU included.
(The paper's extra factor r^(m−n), r ≤ 1, is a decay, which ``spe`` keeps apart.)

P^m is never formed by m compositions: P splits into disjoint cycles, and an index at place j
of a cycle of length ℓ goes to the index at place (j + m) mod ℓ, so P^m is one integer
modulo per index, exact at any position (negative ones too).

Convention: (P x)_i = x_{p_i}, i.e. ``x[..., p]``; then (P^m x)_i = x_{p^m(i)} with p^m the
m-fold composition of the index map p.
"""

from __future__ import annotations

from dataclasses import dataclass
import torch
from torch import Tensor, nn

from spe.encodings.positions import require_positive
from spe.encodings.spec import FeatureEncoding, PositionalSpec

__all__ = ["PermuteFeatures", "PermuteOptions", "cycle_tables", "permutation_powers", "permute_weights_reference", "random_permutations", "SPEC"]


def random_permutations(num_heads: int, size: int, *, generator: torch.Generator) -> Tensor:
    """(H, M) int64: an independent uniform permutation of 0 … M − 1 per head, from ``generator``."""
    # drawn on the CPU (the generator's device) even under a default-device context such as the
    # meta device that checkpoint loading builds its shape-only skeleton on
    return torch.stack([torch.randperm(size, generator=generator, device="cpu") for _ in range(num_heads)])


def cycle_tables(permutation: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The cycles of each head's permutation, as four (H, M) int64 tables.

    Returns:
        order: per head, the indices listed cycle after cycle (i, p(i), p(p(i)), …);
        start: for index i, where its cycle begins in ``order``;
        length: for index i, its cycle's length ℓ;
        place: for index i, its place j in its cycle (``order[start + j] == i``).

    Raises:
        ValueError: if a row of ``permutation`` (H, M) is not a permutation of 0 … M − 1.
    """
    if permutation.dim() != 2 or not torch.equal(permutation.sort(dim=-1).values,
                                                  torch.arange(permutation.shape[-1], device=permutation.device).expand_as(permutation)):
        raise ValueError(f"each row must be a permutation of 0 … M − 1, got shape {tuple(permutation.shape)}")
    rows = [_cycles(row) for row in permutation.tolist()]
    return tuple(torch.tensor([row[k] for row in rows], dtype=torch.int64, device=permutation.device)
                 for k in range(4))


def _cycles(p: list[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    m = len(p)
    order, start, length, place, seen = [], [0] * m, [0] * m, [0] * m, [False] * m
    for first in range(m):
        if seen[first]:
            continue
        begin, i, cycle = len(order), first, []
        while not seen[i]:
            seen[i] = True
            cycle.append(i)
            i = p[i]
        for j, index in enumerate(cycle):
            start[index], length[index], place[index] = begin, len(cycle), j
        order.extend(cycle)
    return order, start, length, place


def permutation_powers(tables: tuple[Tensor, Tensor, Tensor, Tensor], positions: Tensor) -> Tensor:
    """p^m for each position m: (L, H, M) int64 indices, ``x.gather(-1, ·)`` applies P^m.

    Args:
        tables: :func:`cycle_tables` of the (H, M) permutation.
        positions: (L,) integer positions (any sign, any size: one modulo per index).
    """
    order, start, length, place = tables
    m = positions.to(torch.int64)[:, None, None]  # (L, 1, 1)
    where = start + torch.remainder(place + m, length)  # (L, H, M), remainder is ≥ 0 for ℓ > 0
    return order.expand(m.shape[0], -1, -1).gather(-1, where)


def permute_weights_reference(phi_q: Tensor, phi_k: Tensor, positions: Tensor,
                              permutation: Tensor) -> tuple[Tensor, Tensor]:
    """The slow twin of :class:`PermuteFeatures` in linear attention: explicit O(L²) weights,
    float64, with P^τ as a power of the permutation matrix (independent of the cycle tables).

    Args:
        phi_q, phi_k: (B, L, H, M) unpermuted features (keys with any scale applied).
        positions: (L,) integers.
        permutation: (H, M), (P x)_i = x_{p_i}.

    Returns:
        weights φ(q_m)ᵀ P^(n−m) φ(k_n), (B, H, L, L) (query m, key n), unmasked, twice (the
        normaliser's are the same).
    """
    h, m = permutation.shape
    matrix = torch.zeros(h, m, m, dtype=torch.float64)
    matrix[torch.arange(h)[:, None], torch.arange(m), permutation] = 1.0  # P[i, p_i] = 1
    pos = [int(t) for t in positions]
    fq, fk = phi_q.double(), phi_k.double()
    rows = []
    for i, pm in enumerate(pos):
        powers = torch.stack([torch.linalg.matrix_power(matrix, pn - pm) for pn in pos], dim=1)  # (H, L, M, M)
        rows.append(torch.einsum("bhi,hnij,bnhj->bhn", fq[:, i], powers, fk))
    weights = torch.stack(rows, dim=2)  # (B, H, L, L)
    return weights, weights


class PermuteFeatures(FeatureEncoding):
    """PermuteFormer's position-wise permutation of the kernel's features, as a feature
    transform of :class:`~spe.attention.MultiHeadAttention`.

    The permutations are drawn once, from an explicit generator, and kept in the buffer
    ``permutation`` (H, M), so a checkpoint reproduces them; the cycle tables derived from it
    are rebuilt whenever it is loaded. Every layer built with the same seed draws the same
    permutations (as PermuteFormer's code does: one seed for all layers).

    Args:
        num_heads: H.
        feature_dim: M, the kernel's feature dimension (``num_features`` for performer,
            head_dim for the elementwise kernels).
        seed: seed of the generator (used when ``generator`` is None).
        generator: the source of the permutations.

    Raises:
        ValueError: on sizes that are not positive integers.
    """

    numerator_only = False  # permuted features stay non-negative: normaliser permuted alike
    label = "PermuteFormer"

    def __init__(self, num_heads: int, feature_dim: int, *, seed: int = 0,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        require_positive("PermuteFeatures", num_heads=num_heads, feature_dim=feature_dim)
        self.num_heads, self.feature_dim = num_heads, feature_dim
        generator = generator if generator is not None else torch.Generator().manual_seed(seed)
        self.register_buffer("permutation", random_permutations(num_heads, feature_dim, generator=generator))
        self._build_tables()

    def _build_tables(self) -> None:
        device = self.permutation.device
        if device.type == "meta":  # shapes only (a skeleton): no values to derive tables from
            tables = [torch.empty_like(self.permutation) for _ in range(4)]
        else:
            tables = cycle_tables(self.permutation)
        for name, table in zip(("order", "start", "length", "place"), tables):
            self.register_buffer(f"cycle_{name}", table, persistent=False)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._build_tables()  # the derived tables follow the loaded permutation

    def powers(self, positions: Tensor) -> Tensor:
        """(L, H, M) indices of P^m at ``positions`` (L,).

        Raises:
            ValueError: on positions that are not integers.
        """
        if positions.is_floating_point() and not torch.equal(positions, positions.round()):
            raise ValueError("PermuteFormer permutes features a whole number of times: positions must be "
                             f"integers, got {positions[positions != positions.round()][:3].tolist()}")
        tables = (self.cycle_order, self.cycle_start, self.cycle_length, self.cycle_place)
        return permutation_powers(tables, positions.to(self.cycle_order.device))

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """x: (B, L, H, M), positions: (L,) integers → (B, L, H, M) with P_h^m applied at position m.

        Raises:
            ValueError: on positions that are not (L,) integers, or features of another M or H.
        """
        if positions.shape != (x.shape[1],):
            raise ValueError(f"positions must have shape ({x.shape[1]},), got {tuple(positions.shape)}")
        if x.shape[2:] != (self.num_heads, self.feature_dim):
            raise ValueError(f"PermuteFormer permutes (H, M) = ({self.num_heads}, {self.feature_dim}) features, "
                             f"got {tuple(x.shape[2:])}")
        index = self.powers(positions)  # (L, H, M)
        return x.gather(-1, index[None].expand(x.shape[0], -1, -1, -1))

    def weights_reference(self, phi_q: Tensor, phi_k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(numerator, normaliser) weights (B, H, L, L), :func:`permute_weights_reference`."""
        return permute_weights_reference(phi_q, phi_k, positions, self.permutation.cpu())

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, feature_dim={self.feature_dim}"


@dataclass(kw_only=True)
class PermuteOptions:
    """PermuteFormer's options.

    Attributes:
        permute_seed: seed of the permutations (drawn once, kept in the state dict; every
            layer gets the same ones, as in PermuteFormer's code).
    """

    permute_seed: int = 0

    def check_options(self) -> None:
        """Raises ValueError if ``permute_seed`` is not an integer."""
        if isinstance(self.permute_seed, bool) or not isinstance(self.permute_seed, int):
            raise ValueError(f"permute_seed must be an integer, got {self.permute_seed!r}")


SPEC = PositionalSpec("permute", "features", source="Chen 2021 (EMNLP), PermuteFormer",
                      layer_module=lambda c, causal: PermuteFeatures(c.num_heads, c.feature_dim, seed=c.permute_seed),
                      options=(PermuteOptions,))
