"""minibert: a from-scratch, minimal-dependency BERT in pure PyTorch.

    >>> import minibert
    >>> model = minibert.BertForMaskedLM(minibert.BertConfig.preset("tiny", vocab_size=1000))
"""

from .config import BertConfig
from .rng import set_seed
from .tokenizer import Tokenizer
from .model import BertModel, BertOutput
from .heads import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from .multitask import BertMultiTask
from .sentence import SentenceEncoder

__version__ = "0.1.0"

__all__ = [
    "BertConfig",
    "BertModel",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
    "BertMultiTask",
    "BertOutput",
    "MaskedLMOutput",
    "SequenceClassifierOutput",
    "TokenClassifierOutput",
    "QuestionAnsweringModelOutput",
    "SentenceEncoder",
    "Tokenizer",
    "set_seed",
]
