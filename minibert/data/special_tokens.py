"""BERT's five special tokens, the first five ids of every vocabulary minibert trains.

Kept apart so that the tokenizer and its trainer (tokenizer_train.py) both read them without
importing each other.
"""

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
# Order matters for trained vocabularies: [PAD] must be id 0 so that zero-filled
# buffers are padding, as in every BERT checkpoint.
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
