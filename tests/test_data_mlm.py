"""Packing into [CLS] ... [SEP] blocks, and the MLM collator's padding and masking."""
import numpy as np
import pytest
import torch

from facts import raises
from minibert.data import MLMCollator, PackedMLMDataset, tokenize_to_memmap

CLS, SEP, PAD, MASK, UNK = 2, 3, 0, 4, 1


class ToyTokenizer:
    """Just the attributes the data pipeline reads; ids 0-4 special, 5.. ordinary."""

    def __init__(self, vocab_size=1000):
        self.vocab_size = vocab_size
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = PAD, UNK, CLS, SEP, MASK
        self.special_ids = (PAD, UNK, CLS, SEP, MASK)
        self.fingerprint = f"toy{vocab_size}"

    def encode_batch(self, texts, add_special_tokens=True):
        return [[int(w) for w in t.split()] for t in texts]


@pytest.fixture
def token_file(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(5, 1000, size=n).tolist() for n in (7, 1, 30, 12, 55, 3, 40)]
    tf = tokenize_to_memmap([" ".join(map(str, d)) for d in docs], ToyTokenizer(),
                            tmp_path / "t.tok")
    return tf, docs


@pytest.mark.parametrize("seq_len", [3, 8, 16, 64])
def test_packing_is_full_sentences_with_sep_between_documents(token_file, seq_len):
    tf, docs = token_file
    stream = [t for d in docs for t in d + [SEP]]  # reference, built the obvious way
    ds = PackedMLMDataset(tf, seq_len)
    body = seq_len - 2
    assert len(ds) == len(stream) // body
    for i in range(len(ds)):
        item = ds[i]
        ids = item["input_ids"]
        assert item["index"] == i and ids.dtype == np.int64 and ids.shape == (seq_len,)
        assert ids[0] == CLS and ids[-1] == SEP
        assert ids[1:-1].tolist() == stream[i * body:(i + 1) * body]
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_packing_errors(token_file):
    tf, _ = token_file
    for bad in (2, 0, -1, 3.5):
        with pytest.raises(ValueError, match="seq_len"):
            PackedMLMDataset(tf, bad)
    with raises(ValueError, str(tf.path), f"{tf.n_tokens} tokens", "seq_len=10000"):
        PackedMLMDataset(tf, 10_000)
    with raises(ValueError, str(tf.path), "tokenizer", "tokenize_to_memmap"):
        PackedMLMDataset(tf, 8, tokenizer=ToyTokenizer(2000))


def random_examples(n, rng, lo=3, hi=40, vocab=1000):
    out = []
    for _ in range(n):
        body = rng.integers(5, vocab, size=int(rng.integers(lo, hi))).tolist()
        out.append([CLS] + body + [SEP])
    return out


def test_dynamic_padding_and_output_fields():
    rng = np.random.default_rng(1)
    ex = random_examples(5, rng)
    lengths = [len(e) for e in ex]
    batch = MLMCollator(ToyTokenizer())(ex)
    T = max(lengths)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    for v in batch.values():
        assert v.shape == (5, T) and v.dtype == torch.int64
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert batch["token_type_ids"].abs().sum() == 0
    for b, n in enumerate(lengths):
        assert (batch["input_ids"][b, n:] == PAD).all() and (batch["labels"][b, n:] == -100).all()
    padded = MLMCollator(ToyTokenizer(), pad_to_multiple_of=16)(ex)
    assert padded["input_ids"].shape[1] == -(-T // 16) * 16
    # padding further does not change the masking of the real tokens
    assert torch.equal(padded["labels"][:, :T], batch["labels"])
    assert torch.equal(padded["input_ids"][:, :T], batch["input_ids"])


def test_token_type_ids_are_kept_when_given():
    ex = [{"input_ids": [CLS, 7, SEP, 8, SEP], "token_type_ids": [0, 0, 0, 1, 1], "index": 0},
          {"input_ids": [CLS, 9, SEP], "index": 1}]
    batch = MLMCollator(ToyTokenizer())(ex)
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]


@pytest.mark.parametrize("p", [0.15, 0.3])
def test_80_10_10_proportions_on_a_large_sample(p):
    rng = np.random.default_rng(2)
    ex = random_examples(3000, rng, lo=60, hi=120)
    # sprinkle specials inside the text: they must never be selected either
    for e in ex[:500]:
        e[5], e[9] = UNK, MASK
    collate = MLMCollator(ToyTokenizer(), mlm_probability=p, seed=3)
    batch = collate([{"input_ids": e, "index": i} for i, e in enumerate(ex)])
    ids, labels = batch["input_ids"], batch["labels"]
    original = torch.full_like(ids, PAD)
    for b, e in enumerate(ex):
        original[b, :len(e)] = torch.tensor(e)
    selected = labels != -100
    special = torch.isin(original, torch.tensor([PAD, UNK, CLS, SEP, MASK]))
    assert not (selected & special).any()
    assert torch.equal(labels[selected], original[selected])
    assert torch.equal(ids[~selected], original[~selected])
    n_ordinary = (~special).sum().item()
    assert abs(selected.sum().item() / n_ordinary - p) < 0.01
    n = selected.sum().item()
    masked = (ids[selected] == MASK).sum().item() / n
    kept = (ids[selected] == original[selected]).sum().item() / n
    replaced = 1 - masked - kept
    assert abs(masked - 0.8) < 0.01 and abs(kept - 0.1) < 0.01 and abs(replaced - 0.1) < 0.01
    random_tokens = ids[selected & (ids != MASK) & (ids != original)]
    assert random_tokens.min() >= 5 and random_tokens.max() < 1000  # ordinary tokens only
    # replacements are spread over the vocabulary, not stuck on a few ids
    assert len(torch.unique(random_tokens)) > 0.5 * 995


def test_every_example_gets_at_least_one_prediction():
    ex = [[CLS, 100 + i, SEP] for i in range(200)]  # one candidate each
    batch = MLMCollator(ToyTokenizer(), mlm_probability=0.01)(ex)
    assert ((batch["labels"] != -100).sum(1) == 1).all()
    only_special = MLMCollator(ToyTokenizer())([[CLS, SEP], [CLS, UNK, SEP]])
    assert (only_special["labels"] == -100).all()


def test_masking_is_a_function_of_seed_epoch_index():
    rng = np.random.default_rng(4)
    ex = [{"input_ids": e, "index": 1000 + i} for i, e in enumerate(random_examples(16, rng))]
    collate = MLMCollator(ToyTokenizer(), seed=7)
    full = collate(ex)
    # micro-batches of 4 (each padded to its own longest example) mask identically
    for k in range(4):
        micro = collate(ex[4 * k:4 * k + 4])
        T = micro["input_ids"].shape[1]
        for key in ("input_ids", "labels"):
            assert torch.equal(micro[key], full[key][4 * k:4 * k + 4, :T])
            assert (full[key][4 * k:4 * k + 4, T:] == (PAD if key == "input_ids" else -100)).all()
    # order within the batch does not matter either
    rev = collate(ex[::-1])
    assert torch.equal(rev["labels"].flip(0), full["labels"])
    # same (seed, epoch, index) -> same; any of them changed -> different
    assert torch.equal(MLMCollator(ToyTokenizer(), seed=7)(ex)["labels"], full["labels"])
    assert not torch.equal(MLMCollator(ToyTokenizer(), seed=8)(ex)["labels"], full["labels"])
    assert not torch.equal(collate(ex, epoch=1)["labels"], full["labels"])
    shifted = [{**e, "index": e["index"] + 1} for e in ex]
    assert not torch.equal(collate(shifted)["labels"], full["labels"])
    collate.set_epoch(1)
    assert torch.equal(collate(ex)["labels"], collate(ex, epoch=1)["labels"])
    # explicit indices override, bare sequences fall back to a content key
    bare = [e["input_ids"] for e in ex]
    assert torch.equal(collate(bare, indices=[e["index"] for e in ex], epoch=0)["labels"],
                       full["labels"])
    assert torch.equal(collate(bare)["labels"], collate(bare)["labels"])


def test_collator_errors():
    for bad in (0, 1, -0.1, 1.5, 0.0, 1.0):
        with pytest.raises(ValueError, match="mlm_probability"):
            MLMCollator(ToyTokenizer(), mlm_probability=bad)
    for bad in (0, -8, 2.5):
        with pytest.raises(ValueError, match="pad_to_multiple_of"):
            MLMCollator(ToyTokenizer(), pad_to_multiple_of=bad)
    collate = MLMCollator(ToyTokenizer())
    with raises(ValueError, "empty"):
        collate([])
    with raises(ValueError, "example 1", "empty"):

        collate([[CLS, 7, SEP], []])
    with pytest.raises(ValueError, match="indices"):
        collate([[CLS, 7, SEP]], indices=[1, 2])


def test_works_with_real_tokenizer_and_dataloader(tmp_path):
    from minibert.data.tokenizer import Tokenizer

    texts = ["the lobster is blue until it is cooked, then it is red."] * 40
    tok = Tokenizer.train_from_iterator(texts, vocab_size=200, min_frequency=1, use_cache=False)
    tf = tokenize_to_memmap(texts, tok, tmp_path / "c.tok")
    ds = PackedMLMDataset(tf, 32, tokenizer=tok)
    loader = torch.utils.data.DataLoader(ds, batch_size=8, collate_fn=MLMCollator(tok))
    batch = next(iter(loader))
    assert batch["input_ids"].shape == (8, 32)
    assert (batch["input_ids"][:, 0] == tok.cls_id).all()
    assert ((batch["input_ids"] == tok.mask_id).sum() > 0)


# ---- whole-word masking ------------------------------------------------------------------

@pytest.fixture(scope="module")
def wordpiece_blocks(tmp_path_factory):
    """A small WordPiece vocabulary, so that most words split into several pieces."""
    import random

    import minibert

    rng = random.Random(0)
    stems = ["walk", "talk", "jump", "read", "play", "sing", "paint", "build", "write", "cook"]
    words = [s + rng.choice(["", "ing", "ed", "er", "ers", "able"]) for s in stems * 30]
    docs = [" ".join(rng.choice(words) for _ in range(60)) for _ in range(200)]
    tok = minibert.Tokenizer.train_from_iterator(docs, vocab_size=60, use_cache=False)
    tokens = tokenize_to_memmap(docs, tok, tmp_path_factory.mktemp("wwm") / "c.tok")
    return tok, PackedMLMDataset(tokens, seq_len=64)


def _words(tok, ids):
    """(start, end) of every word in a row of ids, as whole-word masking defines them."""
    spans, start = [], None
    for t, i in enumerate(ids):
        piece = tok.id_to_token(int(i))
        special = int(i) in tok.special_ids
        if start is not None and (special or not piece.startswith("##")):
            spans.append((start, t))
            start = None
        if not special and start is None:
            start = t
    if start is not None:
        spans.append((start, len(ids)))
    return spans


def test_whole_word_masking_predicts_every_piece_of_a_chosen_word(wordpiece_blocks):
    tok, ds = wordpiece_blocks
    collate = MLMCollator(tok, mlm_probability=0.15, seed=1, whole_word_mask=True)
    examples = [ds[i] for i in range(len(ds))]
    batch = collate(examples, epoch=0)
    chosen = n_words = multi = 0
    for b, ex in enumerate(examples):
        ids, labels, inputs = ex["input_ids"], batch["labels"][b], batch["input_ids"][b]
        for s, e in _words(tok, ids):
            picked = (labels[s:e] != -100).tolist()
            assert all(picked) or not any(picked), (s, e, picked)  # never a split word
            n_words += 1
            multi += e - s > 1
            if picked[0]:
                chosen += 1
                masked = (inputs[s:e] == tok.mask_id).tolist()
                assert all(masked) or not any(masked)  # one 80/10/10 decision per word
    assert multi > n_words / 3  # the test data does split words
    assert chosen / n_words == pytest.approx(0.15, abs=0.02)  # the rate is per word


def test_a_word_cut_by_the_block_start_is_a_word_of_its_own(wordpiece_blocks):
    tok, _ = wordpiece_blocks
    cont = [i for i in range(tok.vocab_size) if tok.id_to_token(i).startswith("##")][:2]
    word = next(i for i in range(tok.vocab_size) if i not in tok.special_ids
                and not tok.id_to_token(i).startswith("##"))
    ids = [tok.cls_id, cont[0], cont[1], word, cont[0], tok.sep_id]
    collate = MLMCollator(tok, mlm_probability=0.5, seed=0, whole_word_mask=True)
    seen = set()
    for key in range(200):
        labels = collate([{"input_ids": ids, "index": key}])["labels"][0].tolist()
        picked = tuple(x != -100 for x in labels)
        assert picked[1] == picked[2] and picked[3] == picked[4]
        seen.add(picked)
    assert (False, True, True, False, False, False) in seen  # the cut word alone
    assert (False, False, False, True, True, False) in seen  # the whole word alone


def test_whole_word_masks_do_not_depend_on_the_micro_batch(wordpiece_blocks):
    tok, ds = wordpiece_blocks
    collate = MLMCollator(tok, mlm_probability=0.15, seed=3, whole_word_mask=True)
    examples = [ds[i] for i in range(8)]
    whole = collate(examples, epoch=2)
    parts = [collate(examples[i:i + 3], epoch=2) for i in range(0, 8, 3)]
    for key in ("input_ids", "labels"):
        assert torch.equal(whole[key], torch.cat([p[key] for p in parts]))
    plain = MLMCollator(tok, mlm_probability=0.15, seed=3)(examples, epoch=2)
    assert not torch.equal(plain["labels"], whole["labels"])
