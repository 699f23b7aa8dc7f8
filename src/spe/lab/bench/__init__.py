"""Speed and memory benchmarks (``spe bench``)."""
