"""Look inside Vision Transformers: load a ViT (timm, Hugging Face, torchvision), capture its
attention, analyse it.

    >>> from analysis import load_vit, load_image, capture_attention, attention_rollout
    >>> vit = load_vit("demo")
    >>> record = capture_attention(vit, vit.preprocess(load_image("assets/samples/scene_1_star.png")))
    >>> attention_rollout(record).shape   # (B, gh, gw)
    torch.Size([1, 8, 8])
"""

from .attention.distance import (
    DISTANCE_UNITS,
    UniformDistanceReference,
    distance_in_units,
    distance_unit_length,
    mean_attention_distance,
    uniform_attention_distance,
    uniform_attention_distance_by_layer,
    uniform_distance_reference,
)
from .attention.maps import attention_map, attention_rows, pooling_attention_map
from .attention.mass import top_mass_mask
from .attention.rollout import RolloutMaps, attention_rollout, attention_rollout_by_layer, rollout_maps
from .attention.streaming import SkippedImage, dataset_attention_distance
from .base.archives import ArchiveLimits, read_image_archive
from .base.assets import asset_path
from .base.errors import (
    AnalysisError,
    ArchiveError,
    CheckpointError,
    ImageLoadError,
    ImageTooLargeError,
    ModelLoadError,
    ModelPathNotFoundError,
    NoTextTowerError,
    TextPromptError,
    UnsupportedModelError,
    VitExplorerError,
    WeightsUnavailableError,
)
from .base.images import load_image
from .base.label_space import IMAGENET_1K, LabelSpace, LabelSpaceMatch, label_space, shared_label_space
from .embedding.filters import patch_embedding_components, patch_embedding_filters
from .embedding.position import (
    DistanceBins,
    position_embedding_similarity,
    position_encoding_kinds,
    rotary_position_features,
    similarity_by_distance,
    similarity_distance_bins,
)
from .embedding.relative_position import DecomposedPosition, decomposed_relative_position, relative_position_bias
from .engine.capture import capture_attention
from .explanations import EXPLANATION_METHODS, explain
from .maps.scaling import scale_by_peak
from .maps.upsampling import UPSAMPLING_MODES, masked_image, upsample_map
from .model.geometry import ViTSpec
from .model.loading import load_vit
from .model.loading.loaded import LoadedViT, class_label, class_probabilities, top_classes
from .model.loading.loaded_clip import LoadedCLIP
from .model.loading.two_tower import load_clip
from .records.attention import AttentionRecord
from .records.queries import corresponding_layer, corresponding_query
from .similarity import SimilarityResult, representation_similarity
from .tokens.artifacts import attention_mass, high_norm_tokens, outlier_patches, token_norms
from .tokens.capture import TOKEN_KINDS, capture_tokens, logit_lens
from .tokens.features import feature_pca, patch_similarity
from .tokens.record import TokenRecord

# The reference lists these names in this order (mkdocs.yml: members_order __all__).
__all__ = [
    # what a user needs first: the README's tour
    "load_vit",
    "load_image",
    "capture_attention",
    "attention_map",
    "attention_rollout",
    "explain",
    # attention maps, rollout (Figure 6), explanations
    "AttentionRecord",
    "attention_rollout_by_layer",
    "rollout_maps",
    "RolloutMaps",
    "EXPLANATION_METHODS",
    "masked_image",
    "upsample_map",
    "UPSAMPLING_MODES",
    "scale_by_peak",
    # attention distance (Figure 7, right)
    "mean_attention_distance",
    "uniform_attention_distance",
    "uniform_attention_distance_by_layer",
    "uniform_distance_reference",
    "UniformDistanceReference",
    "DISTANCE_UNITS",
    "distance_unit_length",
    "distance_in_units",
    "dataset_attention_distance",
    "SkippedImage",
    # tokens
    "capture_tokens",
    "TokenRecord",
    "TOKEN_KINDS",
    "logit_lens",
    "token_norms",
    "high_norm_tokens",
    "outlier_patches",
    "attention_mass",
    "feature_pca",
    "patch_similarity",
    # position embeddings and patch-embedding filters (Figure 7, left and centre)
    "position_embedding_similarity",
    "position_encoding_kinds",
    "rotary_position_features",
    "similarity_by_distance",
    "similarity_distance_bins",
    "DistanceBins",
    "relative_position_bias",
    "decomposed_relative_position",
    "DecomposedPosition",
    "patch_embedding_components",
    "patch_embedding_filters",
    # representation similarity (CKA)
    "representation_similarity",
    "SimilarityResult",
    # models: CLIP, the loaded model and its geometry, classes
    "load_clip",
    "LoadedCLIP",
    "LoadedViT",
    "ViTSpec",
    "class_probabilities",
    "class_label",
    "top_classes",
    # lower-level pieces
    "attention_rows",
    "pooling_attention_map",
    "top_mass_mask",
    "corresponding_layer",
    "corresponding_query",
    # images, archives, label spaces, bundled files
    "read_image_archive",
    "ArchiveLimits",
    "label_space",
    "shared_label_space",
    "LabelSpace",
    "LabelSpaceMatch",
    "IMAGENET_1K",
    "asset_path",
    # errors
    "VitExplorerError",
    "AnalysisError",
    "ModelLoadError",
    "UnsupportedModelError",
    "CheckpointError",
    "WeightsUnavailableError",
    "ModelPathNotFoundError",
    "ImageLoadError",
    "ImageTooLargeError",
    "ArchiveError",
    "TextPromptError",
    "NoTextTowerError",
]
