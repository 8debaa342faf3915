"""Tiny random two-tower models (Hugging Face ``CLIPModel`` and ``SiglipModel``) saved in a folder,
with a tiny word-level tokenizer of their own: no network, no downloads."""

from __future__ import annotations

from pathlib import Path

import torch

VISION = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8
)
CONTEXT = 8  # tokens the text tower reads
WORDS = ("a photo of the red blue green star circle square dog cat on left right big small").split()
# start and end are 3 and 4, not 2: CLIP's text model pools the argmax of the ids (its legacy rule) when eos_token_id == 2
PAD, UNK, START, END = 0, 1, 3, 4
VOCAB = {
    "<pad>": PAD,
    "<unk>": UNK,
    "<filler>": 2,
    "<start>": START,
    "<end>": END,
    **{word: 5 + index for index, word in enumerate(WORDS)},
}


def _text_config() -> dict:
    return dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=len(VOCAB),
        max_position_embeddings=CONTEXT,
        pad_token_id=PAD,
        bos_token_id=START,
        eos_token_id=END,
    )


def _perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random init leaves biases, norms and the logit bias at constants: perturb every parameter."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return model.eval()


def save_tokenizer(folder: Path) -> None:
    """A word-level tokenizer (``tokenizers``) that adds ``<start>`` and ``<end>``, saved as a
    transformers ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<start> $A <end>", special_tokens=[("<start>", START), ("<end>", END)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>", bos_token="<start>", eos_token="<end>"
    )
    fast.save_pretrained(str(folder))


def build(kind: str, seed: int = 0) -> torch.nn.Module:
    """A perturbed random ``CLIPModel`` (``kind="clip"``) or ``SiglipModel`` with eager attention."""
    import transformers

    torch.manual_seed(seed)
    if kind == "clip":
        config = transformers.CLIPConfig(text_config=_text_config(), vision_config=VISION, projection_dim=16)
        model = transformers.CLIPModel(config)
    else:
        config = transformers.SiglipConfig(text_config=_text_config(), vision_config=VISION)
        model = transformers.SiglipModel(config)
    model.set_attn_implementation("eager")  # so output_attentions returns the softmax weights
    return _perturbed(model, seed)


def save(kind: str, folder: Path, *, tokenizer: bool = True, seed: int = 0) -> torch.nn.Module:
    """Build, save with ``save_pretrained`` into ``folder`` (and the tokenizer), return the model."""
    model = build(kind, seed)
    model.save_pretrained(str(folder))
    if tokenizer:
        save_tokenizer(folder)
    return model
