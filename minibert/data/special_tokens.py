"""BERT's five special tokens, the first five ids of every vocabulary minibert trains (apart,
so that the tokenizer and its trainer read them without importing each other)."""

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
# [PAD] is id 0, so that zero-filled buffers are padding, as in every BERT checkpoint.
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
