"""Downstream: what a pretrained encoder is used for, and how it is scored.

    multitask.py  one encoder, several classification tasks at once
    sentence.py   sentence embeddings (mean, CLS or max pooling) and cosine similarity
    distill.py    knowledge distillation: the loss, and the module the engine drives
    predict.py    batched prediction over a list of encoded examples
    metrics.py    each task's metric, computed the way its benchmark does
    glue.py       GLUE's nine tasks: their files, metrics and the benchmark's average
    blimp.py      zero-shot grammar: BLiMP's minimal pairs scored by pseudo-log-likelihood

What it may import: the model, the data pipeline, interop and the machine room. Never the
engine's run (`training`) or the scripts (`cli`).
"""
