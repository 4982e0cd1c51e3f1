"""The Python-side BERT normalizer gives exactly the Rust pipeline's ids."""

import random
import unicodedata

import pytest
from tokenizers import normalizers

from minibert import Tokenizer
from minibert.data import tokenize_to_memmap
from minibert.data.normalize import FastEncoder, PythonNormalizer

# Text that reaches every branch: controls and odd whitespace (cleaned), capitals and
# accents (lowercased, stripped), marks whose order NFD changes, a spacing mark of nonzero
# combining class (it survives normalization: context), "İ", CJK (spaced), Hangul (decomposed),
# a final sigma (Rust lowercases per character), and special tokens, raw and made by
# normalizing.
CASES = [
    "Plain ASCII, with Capitals and punctuation!",
    "tabs\tand\r\nnewlines\x0b\x0c\x00nul\x7fdel \x1f unit",
    "Café Ångström naïve RÉSUMÉ façade",
    "e\u0301\u0327 a\u0327\u0301 o\u0308\u0304\u0323 stacked marks",
    "\u0915\u093f\u0902 \u0939\u093f\u0928\u094d\u0926\u0940 Devanagari",
    "\U0001d165\u0301 x\u0301\U0001d165 spacing stem",
    "x\U0001d16d\U0001d165 two spacing marks that NFD puts in the other order",
    "İstanbul İİ",
    "中文字符 mixed with 日本語 and 한국어",
    "ΟΔΟΣ Σίσυφος σ",
    "a [MASK] token, a [mask] one, [CLS] and [SEP]",
    "[MA\x00SK] and [CL\u200bS] and [MASK\u0301]",
    "zero\u200bwidth\u200djoiner\ufeffbom \ufffd replacement \u00a0nbsp \u3000ideo",
    "emoji 🙂👍🏽 and math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ﬁ ligature Ⅻ",
    "",
    "   ",
    "x" * 150 + " a word longer than the WordPiece limit",
]

POOL = ("abcXYZ019 .,;[]#-'\"\t\n\x00\x7f\x1fÉéÅñüßİıΣσς中日한ﬁ𝔘🙂\u0301\u0327\u0308\u0323"
        "\u093f\u094d\u0902\U0001d165\u200b\u200d\ufeff\ufffd\u00a0\u3000") + "[MASK][CLS]"


def _random_texts(n, seed=0, wide=0.3):
    """`n` strings of up to 40 characters, a share `wide` of them drawn from the whole
    range U+0080 - U+2FFF, the others from POOL."""
    rng = random.Random(seed)
    bmp = [chr(c) for c in range(0x80, 0x3000) if unicodedata.category(chr(c)) != "Cs"]
    out = []
    for _ in range(n):
        pool = bmp if rng.random() < wide else POOL
        out.append("".join(rng.choice(pool) for _ in range(rng.randint(0, 40))))
    return out


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def tokenizer(request):
    corpus = [c for c in CASES if c.strip()] * 3 + _random_texts(300, seed=1, wide=0)
    return Tokenizer.train_from_iterator(corpus, vocab_size=600, lowercase=request.param,
                                         use_cache=False)


def _reference(tok, texts):
    return [e.ids for e in tok.backend.encode_batch(texts, add_special_tokens=False)]


def test_cases_match_the_rust_pipeline(tokenizer):
    fast = FastEncoder.of(tokenizer.backend)
    assert fast is not None
    assert fast.encode_batch(CASES, add_special_tokens=False) == _reference(tokenizer, CASES)
    for text in CASES:  # one by one as well: no order or batching effect
        assert fast.encode_batch([text], add_special_tokens=False) == \
            _reference(tokenizer, [text]), text


def test_normalized_text_is_the_rust_normalizers(tokenizer):
    """Where the Python side normalizes, its text is exactly the Rust normalizer's."""
    normalize = PythonNormalizer.of(tokenizer.backend)
    rust = tokenizer.backend.normalizer.normalize_str
    texts = CASES + _random_texts(3000, seed=3)
    done = [(t, normalize(t)) for t in texts]
    assert sum(out is not None for _, out in done) > len(texts) // 2
    for text, out in done:
        assert out is None or out == rust(text), text


def test_context_cases_take_the_rust_pipeline(tokenizer):
    normalize = PythonNormalizer.of(tokenizer.backend)
    assert normalize("Café") is not None
    assert normalize("a [MASK] b") is None  # a special token in the raw text
    if tokenizer.backend.normalizer.lowercase:  # and so strips accents, with NFD
        assert normalize("x\U0001d165") is None  # a spacing mark, combining class 216
    else:  # no NFD, nothing moves: only special tokens are context
        assert normalize("x\U0001d16d\U0001d165") is not None
        assert normalize("[MA\x00SK]") is None  # [MASK] only once cleaned


def test_random_text_matches_the_rust_pipeline(tokenizer):
    texts = _random_texts(3000)
    fast = FastEncoder.of(tokenizer.backend)
    assert fast.encode_batch(texts, add_special_tokens=False) == _reference(tokenizer, texts)
    assert fast.encode_batch(texts[:50], add_special_tokens=True) == \
        [e.ids for e in tokenizer.backend.encode_batch(texts[:50])]


def test_token_file_is_the_rust_pipelines(tokenizer, tmp_path):
    docs = [t for t in CASES + _random_texts(500, seed=2) if t.strip()]
    tf = tokenize_to_memmap(docs, tokenizer, tmp_path / "t.tok", batch_docs=64)
    want = [ids for ids in _reference(tokenizer, docs) if ids]
    assert [list(tf.doc(d)) for d in range(tf.n_docs)] == want


def test_other_normalizers_are_left_to_rust(tokenizer, tmp_path):
    tok = Tokenizer(tokenizer.backend.__class__.from_str(tokenizer.backend.to_str()))
    tok.backend.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    assert FastEncoder.of(tok.backend) is None
    docs = ["ﬁne Ⅻ CAPITALS", "more text"]
    tf = tokenize_to_memmap(docs, tok, tmp_path / "t.tok")
    assert [list(tf.doc(d)) for d in range(tf.n_docs)] == _reference(tok, docs)


def test_the_trainer_is_fed_what_the_rust_normalizer_makes(tokenizer):
    """Tokenizer training feeds the WordPiece trainer text normalized in Python, with the
    trainer's own normalizer off meanwhile: the text must be the Rust normalizer's, and
    the trained tokenizer must come back with its normalizer."""
    from minibert.data.tokenizer_train import normalized

    texts = CASES + _random_texts(2000, seed=4)
    rust = tokenizer.backend.normalizer.normalize_str
    assert list(normalized(texts, tokenizer.backend)) == [rust(t) for t in texts]
    assert isinstance(tokenizer.backend.normalizer, normalizers.BertNormalizer)
    if tokenizer.backend.normalizer.lowercase:
        assert tokenizer.encode("CAFÉ DOGS") == tokenizer.encode("cafe dogs")
