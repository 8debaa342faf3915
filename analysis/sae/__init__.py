"""Features, not neurons: sparse autoencoders (SAEs) on a ViT's activations.

    >>> from analysis import load_vit
    >>> from analysis.sae import train_sae, sae_metrics, save_sae
    >>> vit = load_vit("demo")
    >>> sae, log = train_sae(vit, images, "blocks.2.resid_post", k=8, expansion=4)   # doctest: +SKIP
    >>> sae_metrics(vit, sae, images).fraction_variance_explained                    # doctest: +SKIP

:class:`SparseAutoencoder` (TopK or ReLU, SAELens's parameter names), training streamed over images
(:func:`train_sae`) or on a tensor (:func:`train_sae_on_activations`), :func:`sae_metrics`,
:func:`splice` (the reconstruction in the forward pass, with features ablated or steered),
:func:`feature_activations`, :func:`top_activating`, and SAELens's on-disk format
(:func:`save_sae`, :func:`load_sae`); the bundled demo SAE on the demo ViT (:func:`load_demo_sae`);
data-parallel training under ``torchrun`` (:class:`DataParallel`); reading features on a model
(:func:`patch_feature_grid`, :func:`build_feature_index`, :func:`feature_class_effect`,
:func:`intervene`: the app's Features page).
"""

from .demo import DEMO_SAE_POINT, load_demo_sae
from .errors import (
    NoClassHeadError,
    NoImagesError,
    SAEConfigError,
    SAEError,
    SAEFeatureError,
    SAEFolderError,
    SAEWidthError,
    UnknownPointError,
)
from .features import (
    FeatureIndex,
    Intervention,
    build_feature_index,
    feature_class_effect,
    intervene,
    patch_feature_grid,
)
from .metrics import SAEMetrics, sae_metrics
from .model import ARCHITECTURES, TOKEN_CHOICES, SAEConfig, SparseAutoencoder, topk_activation
from .parallel import DataParallel
from .reading import RESIDUAL_POINTS
from .saelens import load_sae, save_sae
from .splice import TopActivating, feature_activations, splice, top_activating
from .training import TrainingLog, train_sae, train_sae_on_activations

__all__ = [
    "SAEConfig",
    "SparseAutoencoder",
    "ARCHITECTURES",
    "TOKEN_CHOICES",
    "RESIDUAL_POINTS",
    "topk_activation",
    "train_sae",
    "train_sae_on_activations",
    "TrainingLog",
    "sae_metrics",
    "SAEMetrics",
    "splice",
    "feature_activations",
    "top_activating",
    "TopActivating",
    "save_sae",
    "load_sae",
    "load_demo_sae",
    "DEMO_SAE_POINT",
    "DataParallel",
    "SAEError",
    "UnknownPointError",
    "SAEWidthError",
    "SAEConfigError",
    "NoImagesError",
    "SAEFolderError",
    "SAEFeatureError",
    "NoClassHeadError",
    "patch_feature_grid",
    "build_feature_index",
    "FeatureIndex",
    "feature_class_effect",
    "intervene",
    "Intervention",
]
