"""The exact-kernel oracle of SPE: softmax attention with the scores SPE estimates.

Letters: B = batch, L = length (Lq queries, Lk keys), H = num_heads, D = head_dim,
K = num_sines, T = number of lags.

SPE + softmax computes exp(q̂·k̂/√R) with a random code (eq. 16-17 of Liutkus et al. 2021);
the exponent's expectation over the code is eq. (8) with the gated kernel (eq. 23-25):

    s(m, n) = Σ_d q_md k_nd P̃_d(m − n) / √D,   P̃_d = (1 − δ_d) P_d + δ_d   (δ_d = 0 ungated),

where P_d is :meth:`SineSPE.kernel <spe.encodings.SineSPE.kernel>` or
:meth:`ConvSPE.kernel <spe.encodings.ConvSPE.kernel>` (same normalisation as the sampled
codes, E[Q̄_d K̄_dᵀ]/R). The oracle is softmax attention with exactly these scores: no noise,
O(L²) scores (convSPE's kernel vanishes beyond P lags: O(L·P·D) more for its 2P − 1 diagonals).

Its parameters are SPE's own: the model keeps the SineSPE/ConvSPE module (``encoding.*``,
``layer_encodings.*``) and each layer an :class:`ExactSPEScores` holding the gate logits, whose
state-dict key is aliased to the SPE filter's (``blocks.N.attn.spe_filter.gate_logits``, see
:func:`alias_gate_keys`), so an SPE checkpoint loads into the oracle and back. The layer module
asks the model-level module for its exact kernel (:meth:`ExactSPEScores.bind`); it draws nothing.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spe.encodings.conv import ConvOptions, ConvSPE
from spe.encodings.filter import SPEOptions, check_gate_init
from spe.encodings.positions import require_positive
from spe.encodings.sine import SineOptions, SineSPE
from spe.ops.sine.phases import sine_features
from spe.ops.softmax import check_key_padding_mask
from spe.encodings.conv import build_conv
from spe.encodings.sine import build_sine
from spe.encodings.spec import PositionalSpec, ScoreEncoding, head_dim

__all__ = ["ExactSPEScores", "alias_gate_keys", "exact_spe_attention_reference", "gated_kernel",
           "unalias_gate_keys", "SPECS"]

# Where the per-layer module sits in an attention layer (spe.attention.layer.positional_role)
# and where SPE's filter, holding the same gate, sits: the state dict uses the latter.
_ORACLE_GATE = "attn.score_encoding.gate_logits"
_SPE_GATE = "attn.spe_filter.gate_logits"


def gated_kernel(kernel: Tensor, gate: Tensor | None) -> Tensor:
    """P̃ = (1 − δ) P + δ (eq. 23-25 in expectation): kernel (H, D, ...), gate (H, D) or None."""
    if gate is None:
        return kernel
    gate = gate.reshape(*gate.shape, *(1,) * (kernel.dim() - 2)).to(kernel)
    return (1 - gate) * kernel + gate


def _lags(lq: int, lk: int, query_offset: int, device: torch.device) -> Tensor:
    """(Lq, Lk) lags m − n of queries at query_offset … and keys at 0 …."""
    return (torch.arange(lq, device=device)[:, None] + query_offset) - torch.arange(lk, device=device)[None, :]


def _attend(scores: Tensor, v: Tensor, *, causal: bool, query_offset: int,
            key_padding_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Masked softmax of (B, H, Lq, Lk) scores, then the values (B, Lk, H, Ev): (output, weights)."""
    lq, lk = scores.shape[-2:]
    if causal:
        scores = scores.masked_fill(_lags(lq, lk, query_offset, scores.device) < 0, float("-inf"))
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    weights = scores.softmax(dim=-1)
    return torch.einsum("bhmn,bnhe->bmhe", weights, v.to(weights.dtype)), weights


def exact_spe_attention_reference(q: Tensor, k: Tensor, v: Tensor, kernel, *, gate: Tensor | None = None,
                                  causal: bool, query_offset: int = 0,
                                  key_padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The oracle written out in float64: every pair's gated kernel gathered, O(B·H·Lq·Lk·D).

    The slow, obviously correct twin of :meth:`ExactSPEScores.attend`.

    Args:
        q: (B, Lq, H, D) queries at positions query_offset … query_offset + Lq − 1.
        k: (B, Lk, H, D) keys at positions 0 … Lk − 1.
        v: (B, Lk, H, Ev) values.
        kernel: ``lags (T,) -> (H, D, T)``, the ungated P_d (an SPE module's ``kernel``).
        gate: (H, D) δ, or None.
        causal: keys after a query get no weight.
        query_offset: position of the first query.
        key_padding_mask: (B, Lk) bool, True at padding keys.

    Returns:
        Output (B, Lq, H, Ev) and weights (B, H, Lq, Lk), float64.
    """
    lq, lk, d = q.shape[1], k.shape[1], q.shape[-1]
    lags = _lags(lq, lk, query_offset, q.device)
    table = gated_kernel(kernel(lags.flatten()).double(), None if gate is None else gate.double())
    table = table.reshape(*table.shape[:2], lq, lk)  # (H, D, Lq, Lk)
    scores = torch.einsum("bmhd,bnhd,hdmn->bhmn", q.double(), k.double(), table) / math.sqrt(d)
    return _attend(scores, v.double(), causal=causal, query_offset=query_offset, key_padding_mask=key_padding_mask)


class ExactSPEScores(ScoreEncoding):
    """Per attention layer: SPE's gate and the exact expected scores (a score term, softmax only).

    Built by the registry for ``sinespe-exact`` and ``convspe-exact``; the model binds it to its
    layer's SPE module (:meth:`bind`), which it asks for the kernel at every call (so gradients
    reach the frequencies, phases and gains, or the filters, as well as the gate).

    Args:
        num_heads: H.
        head_dim: D.
        gated: learn a gate δ = sigmoid(logit) per (head, feature), as :class:`~spe.SPEFilter`.
        gate_init: initial gate logit.
        causal: keys after a query get no weight.

    Raises:
        ValueError: if ``num_heads`` or ``head_dim`` is not a positive integer.
    """

    def __init__(self, num_heads: int, head_dim: int, *, gated: bool = False, gate_init: float = 0.0,
                 causal: bool = True) -> None:
        super().__init__()
        require_positive("ExactSPEScores", num_heads=num_heads, head_dim=head_dim)
        self.num_heads, self.head_dim, self.causal = num_heads, head_dim, causal
        check_gate_init(gate_init)
        self.gate_logits = nn.Parameter(torch.full((num_heads, head_dim), float(gate_init))) if gated else None
        self.__dict__["_source"] = None  # not a submodule: the model owns (and saves) it

    def bind(self, source: nn.Module) -> None:
        """Uses ``source`` (a :class:`~spe.SineSPE` or :class:`~spe.ConvSPE` owned by the model)
        for the kernel.

        Raises:
            ValueError: if ``source`` has no ``kernel`` method or other heads or features.
        """
        if not callable(getattr(source, "kernel", None)):
            raise ValueError(f"ExactSPEScores needs an SPE module with a kernel(lags) method, got "
                             f"{type(source).__name__}")
        shape = (getattr(source, "num_heads", None), getattr(source, "head_dim", None))
        if shape != (self.num_heads, self.head_dim):
            raise ValueError(f"ExactSPEScores of (num_heads, head_dim) = {(self.num_heads, self.head_dim)} "
                             f"cannot use an SPE module of {shape}")
        self.__dict__["_source"] = source

    @property
    def source(self) -> nn.Module:
        """The bound SPE module. Raises RuntimeError if :meth:`bind` was never called."""
        if self._source is None:
            raise RuntimeError("ExactSPEScores is not bound to an SPE module: call bind(encoding)")
        return self._source

    @property
    def gate(self) -> Tensor | None:
        """(H, D) δ in [0, 1], or None when ungated."""
        return None if self.gate_logits is None else torch.sigmoid(self.gate_logits)

    def kernel(self, lags: Tensor) -> Tensor:
        """(H, D, T) gated kernel P̃_d at the (T,) lags m − n."""
        return gated_kernel(self.source.kernel(lags), self.gate)

    def scores(self, q: Tensor, k: Tensor, *, query_offset: int = 0) -> Tensor:
        """s(m, n) = Σ_d q_md k_nd P̃_d(m − n) / √D, unmasked.

        sineSPE's kernel is a sum of 2K products of sinusoids, so the scores are one product of
        (D·(2K + 1))-dimensional features: exact and O(L²) memory. convSPE's kernel vanishes at
        |m − n| ≥ P: its gate is one more product and its kernel a band of 2P − 1 diagonals,
        O(L·P·D) memory more. Other kernels are gathered per pair of positions, O(L²·D) memory.

        Args:
            q: (B, Lq, H, D) at positions query_offset …; k: (B, Lk, H, D) at 0 ….

        Returns:
            (B, H, Lq, Lk), in at least float32.
        """
        dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), torch.float32)
        q, k = q.to(dtype), k.to(dtype)
        lq, lk = q.shape[1], k.shape[1]
        if isinstance(self.source, SineSPE):
            fq, fk = self._sine_features(q, k, query_offset)
            return torch.einsum("bmhe,bnhe->bhmn", fq, fk) / math.sqrt(self.head_dim)
        if isinstance(self.source, ConvSPE):
            return self._banded_scores(q, k, query_offset) / math.sqrt(self.head_dim)
        # Any other kernel: evaluated once per distinct lag (Lq + Lk − 1 of them), then gathered.
        distinct = torch.arange(query_offset - lk + 1, query_offset + lq, device=q.device)
        table = self.kernel(distinct).to(dtype)[:, :, _lags(lq, lk, query_offset, q.device) + (lk - 1 - query_offset)]
        return torch.einsum("bmhd,bnhd,hdmn->bhmn", q, k, table) / math.sqrt(self.head_dim)

    def _banded_scores(self, q: Tensor, k: Tensor, query_offset: int) -> Tensor:
        """(B, H, Lq, Lk) Σ_d q_md k_nd P̃_d(m − n) for convSPE, without the √D.

        P_d vanishes at |m − n| ≥ P (appendix A.1), so the gated kernel splits into the gate's
        constant, δ_d q_d · k_d (one matmul over all pairs), and (1 − δ_d) P_d on the 2P − 1
        diagonals around m = n: O(B·H·L·P·D) work instead of the O(B·H·L²·D) of gathering the
        kernel for every pair, which at L = 300 cost seconds per layer.
        """
        conv: ConvSPE = self.source
        batch, lq, lk = q.shape[0], q.shape[1], k.shape[1]
        device = q.device
        lags = torch.arange(conv.kernel_size - 1, -conv.kernel_size, -1, device=device)  # (J,) = P − 1 … 1 − P
        kernel = conv.kernel(lags).to(q.dtype)  # (H, D, J)
        gate = self.gate
        if gate is None:
            scores, qs = q.new_zeros(batch, self.num_heads, lq, lk), q
        else:
            gate = gate.to(q.dtype)
            scores, qs = torch.einsum("bmhd,bnhd->bhmn", q * gate, k), q * (1 - gate)
        qs, kt = qs.transpose(1, 2), k.transpose(1, 2)  # (B, H, L, D)
        diagonals = []
        for j, lag in enumerate(lags.tolist()):
            # query m meets key n = m + shift, a key for first ≤ m < last; one diagonal at a time
            # keeps the work's memory at O(B·H·L·D) (the (B, L, J, H, D) product was 2× slower).
            shift = query_offset - lag
            first, last = max(0, -shift), min(lq, lk - shift)
            if last <= first:
                diagonals.append(q.new_zeros(batch, self.num_heads, lq))
                continue
            diagonal = (qs[:, :, first:last] * kt[:, :, first + shift:last + shift]) @ kernel[:, :, j, None]
            diagonals.append(F.pad(diagonal.squeeze(-1), (first, lq - last)))
        band = torch.stack(diagonals, dim=-1)  # (B, H, Lq, J), zero where the key would be outside
        cols = (torch.arange(lq, device=device)[:, None] + query_offset - lags[None, :]).clamp(0, lk - 1)
        # A clamped column receives zeros; within a row, the columns inside the keys are distinct.
        return scores.scatter_add(-1, cols.expand(batch, self.num_heads, lq, -1), band)

    def _sine_features(self, q: Tensor, k: Tensor, query_offset: int) -> tuple[Tensor, Tensor]:
        """(B, L, H, D·(2K + 1)) features whose dot product is Σ_d q_d k_d P̃_d(m − n).

        P_d(m − n) = Σ_j a_dj(m) b_dj(n) with a = Ω_q λ̈ / √(2K), b = Ω_k λ̈ / √(2K) (eq. 19-21,
        cos(x + θ)cos(y) + sin(x + θ)sin(y) = cos(x − y + θ)); the gate puts (1 − δ) on the
        query side and appends the plain q_d δ_d · k_d term.
        """
        sine: SineSPE = self.source
        device = q.device
        pos_q = torch.arange(q.shape[1], device=device) + query_offset
        pos_k = torch.arange(k.shape[1], device=device)
        gains = sine.gains.repeat_interleave(2, dim=-1).to(q.dtype) / math.sqrt(2 * sine.num_sines)  # (H, D, 2K)
        a = sine_features(sine.frequencies, pos_q, sine.phases).to(q.dtype) * gains  # (Lq, H, D, 2K)
        b = sine_features(sine.frequencies, pos_k, None).to(q.dtype) * gains
        gate = self.gate
        qs = q if gate is None else q * (1 - gate.to(q.dtype))
        fq, fk = (qs[..., None] * a).flatten(-2), (k[..., None] * b).flatten(-2)
        if gate is None:
            return fq, fk
        return torch.cat([fq, q * gate.to(q.dtype)], dim=-1), torch.cat([fk, k], dim=-1)

    def score_bias(self, q: Tensor, num_keys: int, *, query_offset: int = 0) -> Tensor:
        """Refused: the oracle's scores are not q·k/√D plus a term of the queries alone.

        Raises:
            ValueError: always, naming :meth:`scores` and :meth:`weights`, which take the keys.
        """
        raise ValueError("the SPE oracle's scores Σ_d q_d k_d P̃_d(m − n)/√D are not q·k/√D plus a term of the "
                         "queries: use ExactSPEScores.scores(q, k) or .weights(q, k)")

    def weights(self, q: Tensor, k: Tensor, *, query_offset: int = 0,
                key_padding_mask: Tensor | None = None) -> Tensor:
        """(B, H, Lq, Lk) attention weights (rows sum to 1 over visible, real keys)."""
        v = q.new_zeros(k.shape[0], k.shape[1], k.shape[2], 1)
        return self._attend(q, k, v, query_offset=query_offset, key_padding_mask=key_padding_mask)[1]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, query_offset: int = 0,
               key_padding_mask: Tensor | None = None) -> Tensor:
        """Softmax attention with the exact SPE scores.

        Args:
            q: (B, Lq, H, D) queries at positions query_offset … query_offset + Lq − 1.
            k: (B, Lk, H, D) keys at positions 0 … Lk − 1.
            v: (B, Lk, H, Ev) values.
            query_offset: position of the first query (a decoding step: Lq = 1, offset t).
            key_padding_mask: (B, Lk) bool, True at padding keys (no weight).

        Returns:
            (B, Lq, H, Ev) in ``v``'s dtype.

        Raises:
            ValueError: on a padding mask of the wrong shape or dtype.
        """
        return self._attend(q, k, v, query_offset=query_offset, key_padding_mask=key_padding_mask)[0].to(v.dtype)

    def _attend(self, q, k, v, *, query_offset, key_padding_mask):
        if key_padding_mask is not None:
            check_key_padding_mask(key_padding_mask, k)
        return _attend(self.scores(q, k, query_offset=query_offset), v, causal=self.causal,
                       query_offset=query_offset, key_padding_mask=key_padding_mask)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, gated={self.gate_logits is not None}, " \
               f"causal={self.causal}"


def _rename(state_dict: dict, prefix: str, old: str, new: str) -> None:
    """Renames keys ``prefix…<.old>`` to ``prefix…<.new>`` in place, keeping their order."""
    if not any(k.startswith(prefix) and k.endswith("." + old) for k in state_dict):
        return
    items = list(state_dict.items())
    state_dict.clear()
    for key, value in items:
        if key.startswith(prefix) and key.endswith("." + old):
            key = key[: -len(old)] + new
        state_dict[key] = value


def alias_gate_keys(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """State-dict post-hook of a model with :class:`ExactSPEScores`: saves each layer's gate
    under the SPE filter's key (``blocks.N.attn.spe_filter.gate_logits``), as an SPE model does."""
    _rename(state_dict, prefix, _ORACLE_GATE, _SPE_GATE)


def unalias_gate_keys(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict, strict: bool,
                      missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
    """Load-state-dict pre-hook, the inverse of :func:`alias_gate_keys`: an SPE checkpoint's
    gates go to the oracle's layers."""
    _rename(state_dict, prefix, _SPE_GATE, _ORACLE_GATE)


def _exact_scores(config, causal: bool) -> ExactSPEScores:
    # The oracle's model module is SPE's own (build_sine, build_conv): same parameters, same values.
    return ExactSPEScores(config.num_heads, head_dim(config), gated=config.gated, gate_init=config.gate_init,
                          causal=causal)


def _exact_sine_scores(config, causal: bool) -> ExactSPEScores:
    if config.spe_time != "index":  # its scores are sineSPE's kernel at index lags
        raise ValueError(f"the SPE oracle's scores are sineSPE's kernel at index lags: it takes spe_time "
                         f"'index', got {config.spe_time!r}")
    return _exact_scores(config, causal)


_EXACT_SOURCE = "Liutkus et al. 2021, eq. (8), (16)–(17), exact expectation"

# The SPE oracles: softmax attention with the scores SPE estimates; deterministic, O(L²) memory
# (plus O(L·P·D) for conv's band), for diagnosis.
SPECS = (
    PositionalSpec("sinespe-exact", "scores", source=_EXACT_SOURCE, model_module=build_sine,
                   layer_module=_exact_sine_scores, options=(SPEOptions, SineOptions)),
    PositionalSpec("convspe-exact", "scores", source=_EXACT_SOURCE, model_module=build_conv, layer_module=_exact_scores,
                   options=(SPEOptions, ConvOptions)),
)
