"""minibert: a from-scratch, minimal-dependency BERT in pure PyTorch.

    >>> import minibert
    >>> model = minibert.BertForMaskedLM(minibert.BertConfig.preset("tiny", vocab_size=1000))
"""

from .config import BertConfig
from .runtime import set_seed
from .tokenizer import Tokenizer
from .model import (
    BertForMaskedLM,
    BertForSequenceClassification,
    BertModel,
    BertOutput,
    MaskedLMOutput,
    SequenceClassifierOutput,
)

__version__ = "0.1.0"

__all__ = [
    "BertConfig",
    "BertModel",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertOutput",
    "MaskedLMOutput",
    "SequenceClassifierOutput",
    "Tokenizer",
    "set_seed",
]
