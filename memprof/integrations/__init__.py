"""Integrations with the trainers people use: a callback each, a few lines for the user.

* :mod:`memprof.integrations.huggingface`: ``MemprofCallback`` for the Hugging Face ``Trainer``
  (``pip install 'memprof[huggingface]'``).
* :mod:`memprof.integrations.lightning`: ``MemprofCallback`` for ``lightning.Trainer``
  (``pip install 'memprof[lightning]'``).
* :mod:`memprof.integrations.probe`: which module's forward a training step really calls (used by the
  Lightning callback; torch only).
* :mod:`memprof.integrations.runs`: a reused ``run_id`` refused when training starts (both callbacks).

Import the submodule you need: this package imports neither framework (nor torch).
"""

__all__: list[str] = []
