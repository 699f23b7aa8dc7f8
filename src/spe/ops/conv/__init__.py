"""convSPE's kernels (eq. (22) of Liutkus et al. 2021): filtering noise into codes, and applying
the codes to queries and keys a block of positions at a time without materialising them.

:mod:`.filters` filters noise by FFT or by direct convolution; :mod:`.naive` is the float64
twin that forms the whole codes; :mod:`.blocked` applies the code block by block and forms
each block's code again in backward.
"""

from spe.ops.conv.blocked import conv_code_product
from spe.ops.conv.filters import direct_filter, fft_filter, fft_size
from spe.ops.conv.naive import conv_code_product_reference

__all__ = ["conv_code_product", "conv_code_product_reference", "direct_filter", "fft_filter", "fft_size"]
