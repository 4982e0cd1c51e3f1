"""transformers' models with random weights, classic BERT or ModernBERT, and minibert's model
loaded from the same folder: the pairs that the tests of transformers' habits compare."""

import pytest
import torch

import minibert
from conftest import hf_config, tiny_config

FLAVOURS = ("classic", "modern")


def random_hf_model(flavour: str, name: str, **fields):
    """transformers' class `name` (ModernBERT's where `flavour` is "modern"), two layers,
    eager attention (the one that hands out attention maps), every weight random."""
    transformers = pytest.importorskip("transformers")
    if flavour == "classic":
        config = hf_config(tiny_config())
        config._attn_implementation = "eager"
    else:
        config = transformers.ModernBertConfig(
            vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=64, local_attention=8,
            global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=2, eos_token_id=3,
            cls_token_id=2, sep_token_id=3, attn_implementation="eager")
        name = "ModernBert" + name.removeprefix("Bert")
    for key, value in fields.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = getattr(transformers, name)(config)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def same_weights(flavour: str, name: str, folder, **fields):
    """(minibert's `name`, transformers' model): one random model, saved to `folder` by
    transformers and loaded from there by minibert."""
    theirs = random_hf_model(flavour, name, **fields)
    theirs.save_pretrained(folder)
    return getattr(minibert, name).from_pretrained(folder), theirs
