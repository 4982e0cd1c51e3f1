"""The model: BERT as a textbook, in the order a reader needs it.

    config.py     BertConfig: every field of a model, validated, and the presets
    model.py      embeddings, the encoder block (Pre-LN or Post-LN), the encoder, BertModel
    attention.py  self-attention: the plain formula, beside SDPA and the chunked form
    rope.py       rotary position embeddings (ModernBERT's positions)
    heads.py      the masked-LM head and the downstream heads

What it may import: torch, the label rule (`minibert.labels`), the machine room by named
calls (`minibert.machine`: the input checks, and the chunked attention's tile buffers;
the CPU kernels come in from outside, `minibert.fast`) and the door to a folder on
disk that the model classes inherit (`minibert.interop.pretrained`). Nothing of the run
(`training`, `cli`), the data pipeline or the tasks: importing the textbook loads none of
them (tests/test_layout.py).
"""
