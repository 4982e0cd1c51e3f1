"""transformers' world: model folders in and out.

    pretrained.py  from_pretrained / save_pretrained, the model classes' door to a folder
    hf.py          transformers' layout: file names, parameter names, safe loading
    export.py      a training checkpoint turned into a model folder
    methods.py     transformers' other model methods: device, embeddings, resizing, ...

What it may import: the model and its config, the tokenizer, and the checkpoint reader.
"""
