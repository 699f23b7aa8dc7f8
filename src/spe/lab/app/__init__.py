"""``spe app``: a page to listen to a model. :mod:`spe.lab.app.core` holds the work (open a run
or an export, prompt, generate, piano roll, audio, the run's evaluation) as plain functions;
:mod:`spe.lab.app.page` the Gradio page over them (the ``app`` extra)."""
