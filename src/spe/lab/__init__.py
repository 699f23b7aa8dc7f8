"""spe.lab: the experiments built on the :mod:`spe` library.

The music language model and the Long Range Arena (tasks with their data and evaluation), the
training engine, sweep plans, analysis, benchmarks and the ``spe`` command. It needs the extras
(``pip install "spe[music,lra]"``); the library under it needs torch and safetensors only and
never imports it.
"""
