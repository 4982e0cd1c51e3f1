"""minibert.tokenizer.Tokenizer: training, caching, loading, and id parity with transformers."""
import json
import os
from collections import Counter

import pytest

from minibert.tokenizer import SPECIAL_TOKENS, Tokenizer

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Café, naïve, résumé, façade — accents everywhere: Ångström, São Paulo, Dvořák.",
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.",
    "Punctuation!!! (parentheses) [brackets] {braces} \"quotes\" 'single' ... ; : ? - _",
    "Emoji are tokens too 🙂🎉 and so are symbols like € £ ¥ © ®.",
    "Internationalization and antidisestablishmentarianism are long words.",
    "Numbers 3.14159, 2,718 and 1e-10; e-mail someone@example.com; http://x.org/a?b=c",
] * 20

PROBES = [
    "Hello, World!",
    "CAFÉ Naïve RÉSUMÉ façade Ångström",
    "東京は日本の首都です。 北京是中国的首都 서울",
    "Emoji 🙂🎉🦀 mixed with text",
    "unbelievably internationalization antidisestablishmentarianism",
    "x" * 99 + " " + "y" * 101 + " " + "z" * 150,
    "tabs\tand\nnewlines\r\n  and   spaces",
    "control\x00chars\x07here and zero\u200bwidth",
    "a [MASK] in the middle, and [CLS] [SEP] [PAD] too",
    "Punctuation!!! (parentheses) [brackets] {braces} ¿¡ … — – \"quotes\"",
    "",
    "   ",
    "numbers 3.14159 2,718 1e-10 someone@example.com",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return Tokenizer.train_from_iterator(CORPUS, vocab_size=400, min_frequency=1,
                                         cache_dir=cache)


def test_special_token_ids_and_vocab_size(trained):
    assert [trained.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS)
    assert (trained.pad_id, trained.unk_id, trained.cls_id, trained.sep_id, trained.mask_id) \
        == (0, 1, 2, 3, 4)
    assert trained.vocab_size <= 400
    assert trained.vocab_size == len(trained)


def test_encode_decode_and_batch(trained):
    ids = trained.encode("The quick brown fox.")
    assert ids[0] == trained.cls_id and ids[-1] == trained.sep_id
    assert trained.encode("The quick brown fox.", add_special_tokens=False) == ids[1:-1]
    assert trained.decode(ids) == "the quick brown fox."
    assert "##" in "".join(trained.backend.encode("antidisestablishmentarian brownies").tokens)
    assert trained.encode_batch(PROBES) == [trained.encode(p) for p in PROBES]
    with pytest.raises(TypeError, match="list of strings"):
        trained.encode_batch("one string")


def test_save_and_reload_roundtrip(trained, tmp_path):
    out = trained.save(tmp_path / "tok")
    assert (out / "tokenizer.json").is_file() and (out / "vocab.txt").is_file()
    lines = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert lines[:5] == list(SPECIAL_TOKENS) and len(lines) == trained.vocab_size
    for source in (out, out / "tokenizer.json", out / "vocab.txt"):
        again = Tokenizer.from_pretrained(source)
        assert [again.encode(p) for p in PROBES] == [trained.encode(p) for p in PROBES], source
    assert Tokenizer.from_pretrained(out).fingerprint == trained.fingerprint


@pytest.mark.parametrize("lowercase", [True, False])
def test_ids_match_transformers_bert_tokenizer(tmp_path, lowercase):
    """Our vocab.txt loader must reproduce transformers' BertTokenizerFast id for id."""
    transformers = pytest.importorskip("transformers")
    tok = Tokenizer.train_from_iterator(CORPUS, vocab_size=600, min_frequency=1,
                                        lowercase=lowercase, use_cache=False)
    # A BERT-style vocabulary: specials where BERT keeps them, plus the trained pieces.
    pieces = [t for t, _ in sorted(tok.backend.get_vocab().items(), key=lambda kv: kv[1])
              if t not in SPECIAL_TOKENS]
    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(3)] + ["[UNK]", "[CLS]", "[SEP]",
                                                              "[MASK]"] + pieces + ["🐙"]
    assert len(set(vocab)) == len(vocab)  # a repeated line would make ids ambiguous
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lowercase}))

    # Loaded the way a checkpoint is: a folder holding vocab.txt and the config.
    ref = transformers.BertTokenizerFast.from_pretrained(str(tmp_path), do_lower_case=lowercase)
    assert ref.convert_tokens_to_ids("[MASK]") == 7  # it really read our vocabulary
    ours = Tokenizer.from_pretrained(tmp_path)
    assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (0, 4, 5, 6, 7)
    for text in PROBES + CORPUS[:7]:
        assert ours.encode(text) == ref(text)["input_ids"], text
        assert ours.encode(text, add_special_tokens=False) == \
            ref(text, add_special_tokens=False)["input_ids"], text
    assert ours.encode_batch(PROBES) == ref(PROBES)["input_ids"]
    # a checkpoint's tokenizer.json (as transformers saves it) loads to the same ids
    ref.save_pretrained(str(tmp_path / "hf"))
    from_json = Tokenizer.from_pretrained(tmp_path / "hf" / "tokenizer.json")
    assert [from_json.encode(t) for t in PROBES] == ref(PROBES)["input_ids"]
    # the emoji we put in the vocabulary is found, others become [UNK]
    assert vocab.index("🐙") in ours.encode("🐙") and ours.unk_id in ours.encode("🦀")
    assert ours.encode("🐙 🦀") == ref("🐙 🦀")["input_ids"]


def test_lowercase_argument_overrides_config(tmp_path, trained):
    trained.save(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    cased = Tokenizer.from_pretrained(tmp_path)
    lower = Tokenizer.from_pretrained(tmp_path, lowercase=True)
    assert cased.encode("THE") != lower.encode("THE")
    assert lower.encode("THE") == trained.encode("THE")


def test_training_is_cached_by_content_and_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIBERT_CACHE", str(tmp_path / "env-cache"))
    f = tmp_path / "corpus.txt"
    f.write_text("\n".join(CORPUS), encoding="utf-8")
    first = Tokenizer.train([f], vocab_size=300, min_frequency=1)
    entries = list((tmp_path / "env-cache" / "tokenizers").iterdir())
    assert len(entries) == 1 and (entries[0] / "tokenizer.json").is_file()

    def no_training(*args, **kwargs):
        raise AssertionError("trained again instead of using the cache")

    with monkeypatch.context() as m:
        m.setattr(Tokenizer, "_bert_pipeline", staticmethod(no_training))
        second = Tokenizer.train(f, vocab_size=300, min_frequency=1)
    assert second.fingerprint == first.fingerprint

    Tokenizer.train([f], vocab_size=250, min_frequency=1)  # other settings: new entry
    f.write_text("\n".join(CORPUS[:3]), encoding="utf-8")
    Tokenizer.train([f], vocab_size=300, min_frequency=1)  # other content: new entry
    assert len(list((tmp_path / "env-cache" / "tokenizers").iterdir())) == 3
    assert not [p for p in (tmp_path / "env-cache" / "tokenizers").iterdir()
                if p.name.startswith(".tmp")]


def test_generators_train_without_cache(tmp_path):
    tok = Tokenizer.train_from_iterator((t for t in CORPUS), vocab_size=300, min_frequency=1,
                                        cache_dir=tmp_path)
    assert tok.vocab_size <= 300
    assert not (tmp_path / "tokenizers").exists()


def test_non_utf8_training_file_warns_with_count(tmp_path):
    f = tmp_path / "bad.txt"
    f.write_bytes("\n".join(CORPUS).encode("utf-8") + b"\nbad \xff\xfe bytes \xc3\n")
    with pytest.warns(UnicodeWarning, match="3 invalid UTF-8"):
        tok = Tokenizer.train([f], vocab_size=400, min_frequency=1, use_cache=False)
    assert tok.vocab_size > 5


def test_empty_corpus_is_rejected(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty corpus"):
        Tokenizer.train([empty], vocab_size=100, use_cache=False)
    with pytest.raises(ValueError, match="empty corpus"):
        Tokenizer.train_from_iterator([], vocab_size=100)
    with pytest.raises(ValueError, match="no files"):
        Tokenizer.train([], vocab_size=100)


def test_vocab_size_too_small(tmp_path):
    with pytest.raises(ValueError, match="special tokens"):
        Tokenizer.train_from_iterator(CORPUS, vocab_size=5)
    with pytest.raises(ValueError, match=r"too small for this corpus.*at least \d+"):
        Tokenizer.train_from_iterator(CORPUS, vocab_size=30, cache_dir=tmp_path)
    assert not (tmp_path / "tokenizers").exists()  # a failed run caches nothing


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        Tokenizer.train([tmp_path / "nope.txt"], vocab_size=100)
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        Tokenizer.train([str(tmp_path / "nope.txt")], vocab_size=100)
    with pytest.raises(FileNotFoundError, match="(?i)reads files.*train_from_iterator"):
        Tokenizer.train(["The quick brown fox.", "Jumps over."], vocab_size=100)
    with pytest.raises(FileNotFoundError, match="tokenizer.json and vocab.txt"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("hello\nworld\n")
    with pytest.raises(ValueError, match=r"lacks the special token"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a valid tokenizers JSON"):
        Tokenizer.from_pretrained(tmp_path / "broken.json")
    assert os.listdir(tmp_path)  # nothing deleted


def test_save_replaces_files_atomically(trained, tmp_path, monkeypatch):
    """A save that fails while writing leaves the previous tokenizer files whole."""
    out = tmp_path / "tok"
    other = Tokenizer.train_from_iterator(CORPUS[:7], vocab_size=200, min_frequency=1,
                                          use_cache=False)
    other.save(out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        trained.save(out)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temporaries either
    assert Tokenizer.from_pretrained(out).fingerprint == other.fingerprint
    trained.save(out)  # an ordinary save then replaces both files
    assert Tokenizer.from_pretrained(out).fingerprint == trained.fingerprint
    assert Tokenizer.from_pretrained(out / "vocab.txt").encode(PROBES[0]) == \
        trained.encode(PROBES[0])
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json", "vocab.txt"]


def test_vocab_txt_with_a_duplicated_line_is_refused(tmp_path):
    """transformers keeps the last id of a duplicated token, which would shift every id
    after it on save; minibert refuses and says which lines to fix."""
    vocab = list(SPECIAL_TOKENS) + ["the", "cat", "##s", "dog", "cat", "sat"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"'cat'.*lines 7 and 10") as err:
        Tokenizer.from_pretrained(tmp_path)
    assert str(tmp_path / "vocab.txt") in str(err.value)


def test_vocab_txt_byte_order_mark_is_ignored(tmp_path):
    vocab = list(SPECIAL_TOKENS) + ["the", "cat", "##s", "sat"]
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (tmp_path / "bom").mkdir()
    (tmp_path / "bom" / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8-sig")
    assert (tmp_path / "bom" / "vocab.txt").read_bytes().startswith(b"\xef\xbb\xbf")
    with_bom = Tokenizer.from_pretrained(tmp_path / "bom")
    plain = Tokenizer.from_pretrained(tmp_path / "plain")
    assert with_bom.pad_id == 0 and with_bom.fingerprint == plain.fingerprint
    assert with_bom.encode("the cats sat") == plain.encode("the cats sat")


def _long_word(n, seed=0):
    import random
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))


LONG = _long_word(300_000)
# Words over 100 characters: alone, glued to punctuation, and one at exactly the limit.
WITH_LONG = [f"before {LONG} after", "x" * 101 + "-tail", "y" * 100 + " end"]
WITHOUT_LONG = ["before after", "-tail", "y" * 100 + " end"]


def _trainer_words(texts, monkeypatch):
    """The words (normalized, pre-tokenized) that training on ``texts`` feeds the trainer."""
    real_pipeline = Tokenizer._bert_pipeline
    seen = []

    class Stop(Exception):
        pass

    class Recording:
        """The real pipeline, except that training records its input and stops."""

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def train_from_iterator(self, iterator, trainer):
            seen.extend(iterator)
            raise Stop

    with monkeypatch.context() as m:
        m.setattr(Tokenizer, "_bert_pipeline",
                  staticmethod(lambda *a: Recording(real_pipeline(*a))))
        with pytest.raises(Stop):
            Tokenizer.train_from_iterator(texts, vocab_size=400, use_cache=False)
    pipeline = real_pipeline(None, True, None)
    return Counter(w for text in seen for w, _ in
                   pipeline.pre_tokenizer.pre_tokenize_str(pipeline.normalizer.normalize_str(text)))


def test_words_over_the_wordpiece_limit_never_reach_the_trainer(monkeypatch):
    """The trainer's cost grows with the square of a word's length, and the model maps
    words over max_input_chars_per_word to [UNK] anyway: such words are dropped first.
    The trainer then gets the same word counts as for the text without them, which is
    what its vocabulary depends on (its ties break in hash order, so two trainings on
    the same text can differ in a few entries: comparing two vocabularies proves less)."""
    words = _trainer_words(CORPUS + WITH_LONG, monkeypatch)
    assert max(map(len, words)) == 100 and "y" * 100 in words
    assert words == _trainer_words(CORPUS + WITHOUT_LONG, monkeypatch)


def test_training_on_an_overlong_word_logs_what_it_skipped(tmp_path, caplog):
    f = tmp_path / "with.txt"
    f.write_text("\n".join(CORPUS + WITH_LONG), encoding="utf-8")
    with caplog.at_level("INFO", logger="minibert.tokenizer"):
        tok = Tokenizer.train([f], vocab_size=400, min_frequency=1, use_cache=False)
    assert caplog.text.count("skipped 2 words longer than 100 characters "
                             "(the longest had 300000)") == 1
    assert tok.encode(f"before {LONG} after", add_special_tokens=False)[1] == tok.unk_id
    with pytest.raises(ValueError, match="empty corpus.*1 over-long words were skipped"):
        Tokenizer.train_from_iterator([" ", LONG], vocab_size=100, use_cache=False)
