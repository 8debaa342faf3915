"""The bundled demo model's pipeline: scene generation (:mod:`.data`), training
(``python -m analysis.demo.train``) and the held-out evaluation (``python -m analysis.demo.evaluate``).
Not part of the analysis API; nothing in :mod:`analysis` imports it."""
