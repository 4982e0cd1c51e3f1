"""The data pipeline: text -> Tokenizer -> TokenFile (memmap) -> packed examples -> batches.

* `tokenizer` WordPiece through `tokenizers`: `Tokenizer`, trained (`tokenizer_train`),
                    called as transformers' (`tokenizer_call`), saved in transformers'
                    layout (`tokenizer_files`), BERT's five special tokens
                    (`special_tokens`)
* `wikitext`  download WikiText and read it as articles
* `tokens`    tokenize a corpus once into a memory-mapped token file
* `normalize` BERT's text normalizer in Python, ahead of the Rust pipeline: the
                    same ids, sooner
* `mlm`       pack it into `[CLS] ... [SEP]` blocks; pad and mask batches
* `sampler`   deterministic, shardable, resumable batch order
* `seq_warmup` sequence-length warmup: early batches cut to fewer positions
* `text`      strict UTF-8 reading, the one reader of every text file; your own
                    folder of `.txt` files as a corpus
* `corpus`    `load_corpus`: a folder read as WikiText or as text files by its
                    layout, refusing mixed folders, with a report of what was read
* `tasks`     fine-tuning: readers (`task_files`: TSV/CSV, CoNLL, SQuAD),
                    encoders for classification, token labels and QA (`qa`),
                    `TaskCollator`, and whole tasks read from two files (`TaskData`)
* `prepare`   a pretraining corpus made ready once: read, the run's tokenizer, the
                    token cache (import `minibert.data.prepare`)

What it may import: the file writers and readers beside it (`minibert.atomic`,
`minibert.paths`), the label rule (`minibert.labels`) and the tasks' span metric. Never the
model, the engine or the scripts: text becomes batches without either.
"""

from __future__ import annotations

import importlib
from typing import Any

# The names above are imported from their module on first use (PEP 562 `__getattr__`), so
# that importing one module of the package (`minibert.data.mlm`, say) loads only what that
# module needs, not the download, corpus and task-file code beside it.
# name -> the module of this package that defines it
_WHERE = {
    "Corpus": "corpus",
    "CorpusFile": "corpus",
    "load_corpus": "corpus",
    "IGNORE_INDEX": "mlm",
    "MLMCollator": "mlm",
    "PackedMLMDataset": "mlm",
    "pad_batch": "mlm",
    "LengthGroupedBatchSampler": "sampler",
    "ShardedSampler": "sampler",
    "LabelMap": "tasks",
    "QAExample": "tasks",
    "Sentence": "tasks",
    "SequenceSplit": "tasks",
    "SpanPrediction": "tasks",
    "TaskCollator": "tasks",
    "TaskData": "tasks",
    "TokenSplit": "tasks",
    "best_span": "tasks",
    "encode_classification": "tasks",
    "encode_qa": "tasks",
    "encode_token_classification": "tasks",
    "random_subset": "tasks",
    "read_conll": "tasks",
    "read_conll_task": "tasks",
    "read_squad": "tasks",
    "read_table": "tasks",
    "read_table_task": "tasks",
    "word_predictions": "tasks",
    "iter_documents": "text",
    "load_text_folder": "text",
    "TokenFile": "tokens",
    "TokenFileError": "tokens",
    "tokenize_to_memmap": "tokens",
    "DownloadError": "wikitext",
    "download_wikitext": "wikitext",
    "load_wikitext": "wikitext",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
