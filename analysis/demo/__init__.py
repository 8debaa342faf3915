"""What the bundled demo models need at run time: scene generation (:mod:`.data`), their shared
normalisation and ``pretrained_cfg`` (:mod:`.config`) and the held-out evaluation
(``python -m analysis.demo.evaluate``). Not part of the analysis API; nothing in :mod:`analysis`
imports it. The training scripts live outside the package, in the repository's ``training/``
folder (``python -m training.train_demo_vit``, ``train_demo_cnn``, ``train_demo_swin``, and
``train_textured_variants``, which fine-tunes the three on textured scenes too)."""
