"""spe.lab: the experiments built on the :mod:`spe` library.

One training engine (:mod:`spe.lab.engine`), one plan runner (:mod:`spe.lab.plans`) and a package
per task with its config, data, evaluation and packaged plans: the music language model
(:mod:`spe.lab.music`), the Long Range Arena (:mod:`spe.lab.lra`) and the synthetic tasks
(:mod:`spe.lab.synth`); then analysis, benchmarks, the listening page and the ``spe`` command. It needs the extras
(``pip install "spe[music,lra]"``); the library under it needs torch and safetensors only and
never imports it.
"""
