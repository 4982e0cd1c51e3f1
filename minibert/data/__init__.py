"""The data pipeline: text -> Tokenizer -> TokenFile (memmap) -> packed examples -> batches.

* `wikitext`  download WikiText and read it as articles
* `tokens`    tokenize a corpus once into a memory-mapped token file
* `normalize` BERT's text normalizer in Python, ahead of the Rust pipeline: the
                    same ids, sooner
* `mlm`       pack it into `[CLS] ... [SEP]` blocks; pad and mask batches
* `sampler`   deterministic, shardable, resumable batch order
* `seq_warmup` sequence-length warmup: early batches cut to fewer positions
* `text`      UTF-8 reading that replaces bad bytes instead of crashing; your own
                    folder of `.txt` files as a corpus
* `corpus`    `load_corpus`: a folder read as WikiText or as text files by its
                    layout, refusing mixed folders, with a report of what was read
* `tasks`     fine-tuning: readers (`task_files`: TSV/CSV, CoNLL, SQuAD),
                    encoders for classification, token labels and QA (`qa`),
                    `TaskCollator`, and whole tasks read from two files (`TaskData`)
* `prepare`   a pretraining corpus made ready once: read, the run's tokenizer, the
                    token cache (import `minibert.data.prepare`: it needs the tokenizer,
                    which needs this package)
"""
from .corpus import Corpus, CorpusFile, load_corpus
from .mlm import IGNORE_INDEX, MLMCollator, PackedMLMDataset, pad_batch
from .sampler import LengthGroupedBatchSampler, ShardedSampler
from .tasks import (
    LabelMap,
    QAExample,
    Sentence,
    SequenceSplit,
    SpanPrediction,
    TaskCollator,
    TaskData,
    TokenSplit,
    best_span,
    encode_classification,
    encode_qa,
    encode_token_classification,
    random_subset,
    read_conll,
    read_conll_task,
    read_squad,
    read_table,
    read_table_task,
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
    "SequenceSplit",
    "ShardedSampler",
    "SpanPrediction",
    "TaskCollator",
    "TaskData",
    "TokenFile",
    "TokenFileError",
    "TokenSplit",
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
    "random_subset",
    "read_conll",
    "read_conll_task",
    "read_squad",
    "read_table",
    "read_table_task",
    "tokenize_to_memmap",
    "word_predictions",
]
