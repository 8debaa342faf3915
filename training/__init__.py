"""Training scripts of the bundled demo models (``assets/demo_vit``, ``demo_cnn``, ``demo_swin``, ``demo_mae``).

Outside the library's import path on purpose: the wheel carries the trained models, not the
code that trained them (``pyproject.toml`` lists its packages; this folder is not among them).
Run from the repository root, as a module or as a file::

    python -m training.train_demo_swin
    python training/train_demo_swin.py

The scripts import the scenes and the shared normalisation from :mod:`analysis.demo`.
"""
