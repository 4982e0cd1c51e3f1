"""The data pipeline: text -> Tokenizer -> TokenFile (memmap) -> packed examples -> batches.

* `tokenizer`   WordPiece through `tokenizers`: trained (`tokenizer_train`), called as
                transformers' (`tokenizer_call`), saved in its layout (`tokenizer_files`),
                BERT's five special tokens (`special_tokens`)
* `wikitext`    download WikiText and read it as articles
* `tokens`      tokenize a corpus once into a memory-mapped token file
* `normalize`   BERT's text normalizer in Python, ahead of the Rust pipeline
* `mlm`         pack it into `[CLS] ... [SEP]` blocks; pad and mask batches
* `sampler`     deterministic, shardable, resumable batch order
* `seq_warmup`  sequence-length warmup: early batches cut to fewer positions
* `text`        strict UTF-8 reading of every text file, gzipped or not; JSON Lines
                documents; a folder of `.txt` files
* `corpus`      `load_corpus`: a folder read by its layout, as WikiText, split files or
                a text folder
* `tasks`       fine-tuning: readers (`task_files`: TSV/CSV, CoNLL, SQuAD), encoders for
                classification, token labels and QA (`qa`), `TaskCollator`, `TaskData`
* `prepare`     a pretraining corpus made ready once (import `minibert.data.prepare`)

What it may import: the file writers and readers beside it (`minibert.atomic`,
`minibert.paths`), the label rule (`minibert.labels`) and the tasks' span metric. Never the
model, the engine or the scripts: text becomes batches without either.
"""
from __future__ import annotations

import importlib
from typing import Any

# The names below are imported from their module on first use (PEP 562 `__getattr__`), so
# that importing one module of the package loads only what that module needs.
_WHERE = {name: module for module, names in {  # name -> the module that defines it
    "corpus": ("Corpus", "CorpusFile", "load_corpus"),
    "mlm": ("IGNORE_INDEX", "MLMCollator", "PackedMLMDataset", "pad_batch"),
    "sampler": ("GlobalBatches", "LengthGroupedBatchSampler", "ShardedSampler",
                "TaskMixtureBatches"),
    "tasks": ("LabelMap", "QAExample", "Sentence", "SequenceSplit", "SpanPrediction",
              "TaskCollator", "TaskData", "TokenSplit", "best_span", "encode_classification",
              "encode_qa", "encode_token_classification", "random_subset", "read_conll",
              "read_conll_task", "read_squad", "read_table", "read_table_task", "word_predictions"),
    "text": ("iter_documents", "load_text_folder"),
    "tokens": ("TokenFile", "TokenFileError", "tokenize_to_memmap"),
    "wikitext": ("DownloadError", "download_wikitext", "load_wikitext"),
}.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
