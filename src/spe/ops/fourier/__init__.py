"""Fourier mixing: FNet's parameter-free token mixer (Lee-Thorp et al. 2022) and its causal twin.

``mixing.py`` the fast forms (FFT; the causal lower triangle by Bluestein's chirp convolution),
``naive.py`` the float64 O(L²) reference, ``recurrent.py`` the decoding step, ``state.py`` its
:class:`FourierState`.
"""

from spe.ops.fourier.mixing import NORMS, causal_fourier_mixing_with_state, fourier_mixing
from spe.ops.fourier.naive import naive_fourier_mixing
from spe.ops.fourier.recurrent import fourier_mixing_step
from spe.ops.fourier.state import FourierState

__all__ = ["NORMS", "FourierState", "causal_fourier_mixing_with_state", "fourier_mixing", "fourier_mixing_step",
           "naive_fourier_mixing"]
