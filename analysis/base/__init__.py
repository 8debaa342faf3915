"""The bottom layer: plain helpers that know nothing of models (typed errors, argument checks,
devices, out-of-memory fallbacks, images and preprocessing, labels, progress, module hooks).
"""
