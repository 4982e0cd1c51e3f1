"""The data pipeline: text -> Tokenizer -> TokenFile (memmap) -> packed examples -> batches.

* `wikitext`  download WikiText and read it as articles
* `tokens`    tokenize a corpus once into a memory-mapped token file
* `mlm`       pack it into `[CLS] ... [SEP]` blocks; pad and mask batches
* `sampler`   deterministic, shardable, resumable batch order
* `seq_warmup` sequence-length warmup: early batches cut to fewer positions
* `text`      UTF-8 reading that replaces bad bytes instead of crashing; your own
                    folder of `.txt` files as a corpus
* `corpus`    `load_corpus`: a folder read as WikiText or as text files by its
                    layout, refusing mixed folders, with a report of what was read
* `tasks`     fine-tuning: readers (`task_files`: TSV/CSV, CoNLL, SQuAD),
                    encoders for classification, token labels and QA (`qa`),
                    and `TaskCollator`
"""
from .corpus import Corpus, CorpusFile, load_corpus
from .mlm import IGNORE_INDEX, MLMCollator, PackedMLMDataset, pad_batch
from .sampler import LengthGroupedBatchSampler, ShardedSampler
from .tasks import (
    LabelMap,
    QAExample,
    Sentence,
    SpanPrediction,
    TaskCollator,
    best_span,
    encode_classification,
    encode_qa,
    encode_token_classification,
    read_conll,
    read_squad,
    read_table,
    word_predictions,
)
from .text import iter_documents, load_text_folder
from .tokens import TokenFile, TokenFileError, tokenize_to_memmap
from .wikitext import DownloadError, download_wikitext, load_wikitext

__all__ = [
    "Corpus",
    "CorpusFile",
    "IGNORE_INDEX",
    "DownloadError",
    "LabelMap",
    "LengthGroupedBatchSampler",
    "MLMCollator",
    "PackedMLMDataset",
    "QAExample",
    "Sentence",
    "ShardedSampler",
    "SpanPrediction",
    "TaskCollator",
    "TokenFile",
    "TokenFileError",
    "best_span",
    "download_wikitext",
    "encode_classification",
    "encode_qa",
    "encode_token_classification",
    "iter_documents",
    "load_corpus",
    "load_text_folder",
    "load_wikitext",
    "pad_batch",
    "read_conll",
    "read_squad",
    "read_table",
    "tokenize_to_memmap",
    "word_predictions",
]
