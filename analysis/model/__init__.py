"""A model as the library reads it: layer geometry, the spec, one attention adapter per family
(``adapters``) and the loaders that turn a source into a ``LoadedViT`` (``loading``).
"""
