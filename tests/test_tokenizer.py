"""minibert.data.tokenizer.Tokenizer: training, caching, loading, and parity with transformers
(ids, pairs and their truncation, offsets, word ids)."""
import json
import os
from collections import Counter

import pytest

from facts import assert_carries, raises, without
from minibert.data.tokenizer import SPECIAL_TOKENS, Tokenizer, truncated_lengths

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
    assert trained.decode(ids, skip_special_tokens=True) == "the quick brown fox."
    assert trained.decode(ids) == "[CLS] the quick brown fox. [SEP]"  # as transformers
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


def test_a_cache_write_that_fails_is_named_and_a_lost_race_keeps_the_winner(
        trained, tmp_path, monkeypatch):
    """Only a cache entry that already exists means another process won the race; a full
    disk or a permission error while caching is an error, named as such."""
    import errno

    def full_disk(directory):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(trained, "save", full_disk)
        with pytest.raises(OSError, match="No space left") as info:
            trained._save_atomically(tmp_path / "entry")
    assert info.value.errno == errno.ENOSPC and str(tmp_path / "entry") in str(info.value)
    assert not (tmp_path / "entry").exists() and not list(tmp_path.glob(".*"))

    trained._save_atomically(tmp_path / "entry")  # the winner
    winner = (tmp_path / "entry" / "tokenizer.json").read_text()
    trained._save_atomically(tmp_path / "entry")  # the loser: keeps the winner's entry
    assert (tmp_path / "entry" / "tokenizer.json").read_text() == winner
    assert not list(tmp_path.glob(".*"))


def test_generators_train_without_cache(tmp_path):
    tok = Tokenizer.train_from_iterator((t for t in CORPUS), vocab_size=300, min_frequency=1,
                                        cache_dir=tmp_path)
    assert tok.vocab_size <= 300
    assert not (tmp_path / "tokenizers").exists()


def test_a_non_utf8_training_file_is_refused_and_nothing_is_cached(tmp_path):
    f = tmp_path / "bad.txt"
    f.write_bytes("\n".join(CORPUS).encode("utf-8") + b"\nbad \xff\xfe bytes \xc3\n")
    with raises(ValueError, str(f), f"line {len(CORPUS) + 1}", "0xff", "iconv"):
        Tokenizer.train([f], vocab_size=400, min_frequency=1, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "tokenizers").exists()


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
    with raises(ValueError, "vocab_size=5", "special tokens"):
        Tokenizer.train_from_iterator(CORPUS, vocab_size=5)
    # the size refused, the size this corpus needs, and the other setting that would help
    with raises(ValueError, "vocab_size=30", "limit_alphabet") as err:
        Tokenizer.train_from_iterator(CORPUS, vocab_size=30, cache_dir=tmp_path)
    needed = [int(w) for w in str(err.value).replace(",", " ").split() if w.isdigit()]
    assert any(n > 30 for n in needed), str(err.value)
    assert not (tmp_path / "tokenizers").exists()  # a failed run caches nothing


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        Tokenizer.train([tmp_path / "nope.txt"], vocab_size=100)
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        Tokenizer.train([str(tmp_path / "nope.txt")], vocab_size=100)
    # a text taken for a file name: the name, and the call that trains on texts
    with raises(FileNotFoundError, "The quick brown fox.", "Tokenizer.train_from_iterator"):
        Tokenizer.train(["The quick brown fox.", "Jumps over."], vocab_size=100)
    with raises(FileNotFoundError, str(tmp_path), "tokenizer.json", "vocab.txt"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("hello\nworld\n")
    with raises(ValueError, str(tmp_path / "vocab.txt"), "special token", "'[CLS]'"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "broken.json").write_text("{not json")
    with raises(ValueError, str(tmp_path / "broken.json"), "JSON"):
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
    trained.save(out)  # an ordinary save then replaces the files
    assert Tokenizer.from_pretrained(out).fingerprint == trained.fingerprint
    assert Tokenizer.from_pretrained(out / "vocab.txt").encode(PROBES[0]) == \
        trained.encode(PROBES[0])
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json", "tokenizer_config.json",
                                                     "vocab.txt"]


def test_vocab_txt_with_a_duplicated_line_is_refused(tmp_path):
    """transformers keeps the last id of a duplicated token, which would shift every id
    after it on save; minibert refuses and says which lines to fix."""
    vocab = list(SPECIAL_TOKENS) + ["the", "cat", "##s", "dog", "cat", "sat"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    with raises(ValueError, str(tmp_path / "vocab.txt"), "'cat'") as err:
        Tokenizer.from_pretrained(tmp_path)
    assert "7" in without(str(err.value), tmp_path) and "10" in without(str(err.value), tmp_path)


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
    what its vocabulary depends on."""
    words = _trainer_words(CORPUS + WITH_LONG, monkeypatch)
    assert max(map(len, words)) == 100 and "y" * 100 in words
    assert words == _trainer_words(CORPUS + WITHOUT_LONG, monkeypatch)


def test_training_on_an_overlong_word_logs_what_it_skipped(tmp_path, caplog):
    f = tmp_path / "with.txt"
    f.write_text("\n".join(CORPUS + WITH_LONG), encoding="utf-8")
    with caplog.at_level("INFO", logger="minibert.data.tokenizer_train"):
        tok = Tokenizer.train([f], vocab_size=400, min_frequency=1, use_cache=False)
    assert caplog.text.count("skipped 2 words longer than 100 characters "
                             "(the longest had 300000)") == 1
    assert tok.encode(f"before {LONG} after", add_special_tokens=False)[1] == tok.unk_id
    with raises(ValueError, "empty corpus", "1 over-long"):
        Tokenizer.train_from_iterator([" ", LONG], vocab_size=100, use_cache=False)


# ---------------------------------------------------------------- pairs, offsets, words

@pytest.fixture(scope="module")
def ours_and_ref(tmp_path_factory):
    """minibert and transformers' BertTokenizerFast loaded from one BERT-style vocab.txt."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("bert-vocab")
    tok = Tokenizer.train_from_iterator(CORPUS, vocab_size=600, min_frequency=1,
                                        use_cache=False)
    pieces = [t for t, _ in sorted(tok.backend.get_vocab().items(), key=lambda kv: kv[1])
              if t not in SPECIAL_TOKENS]
    vocab = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + pieces
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    ref = transformers.BertTokenizerFast.from_pretrained(str(folder))
    assert ref.convert_tokens_to_ids("[MASK]") == 5  # it really read our vocabulary
    return Tokenizer.from_pretrained(folder), ref


# No empty text b: transformers then leaves out the pair, where minibert keeps the second
# [SEP] (an empty segment B, as the pair was asked for).
PAIRS = [(a, b) for a in PROBES[:6] + ["", "a", "the lazy dog"]
         for b in ["The quick brown fox jumps over the lazy dog.", " ", "x y", PROBES[4]]]


def test_truncated_lengths_follow_longest_first():
    assert truncated_lengths(3, 4, 10) == (3, 4)  # fits: nothing cut
    assert truncated_lengths(8, 3, 6) == (3, 3)  # the longer text is cut down to the other
    assert truncated_lengths(2, 8, 6) == (2, 4)  # the shorter stays whole
    assert truncated_lengths(5, 5, 5) == (2, 3)  # a tie: b gets the odd token
    assert truncated_lengths(3, 2, 3) == (2, 1)  # else the longer text gets it
    assert truncated_lengths(9, 2, 5, "only_first") == (3, 2)
    assert truncated_lengths(2, 9, 5, "only_second") == (2, 3)
    # the strategy, the room, the text that fills it, and the way out
    with raises(ValueError, "'only_second'", "5 tokens", "text a", "9", "'longest_first'"):
        truncated_lengths(9, 2, 5, "only_second")
    with raises(ValueError, "'longest'", "longest_first", "only_first", "only_second"):
        truncated_lengths(1, 1, 5, "longest")


@pytest.mark.parametrize("truncation", ["longest_first", "only_first", "only_second"])
def test_encode_pair_matches_transformers(ours_and_ref, truncation):
    """Ids and token types of every pair at every max_length, errors where transformers
    refuses (an only_* strategy whose text cannot shrink enough)."""
    ours, ref = ours_and_ref
    for a, b in PAIRS:
        full = ref(a, b)["input_ids"]
        assert ours.encode_pair(a, b).input_ids == full, (a, b)
        for max_length in sorted({3, 4, 5, 6, 7, 8, 11, 16, len(full) - 1, len(full)}):
            if max_length < 3 or (max_length == 3 and truncation != "longest_first"):
                continue  # at 3, transformers' only_* strategies cut *both* texts to nothing
            try:
                want = ref(a, b, truncation=truncation, max_length=max_length)
            except Exception:  # the Rust side raises a plain Exception
                with raises(ValueError, repr(truncation), f"{max_length - 3} tokens"):
                    ours.encode_pair(a, b, max_length=max_length, truncation=truncation)
                continue
            got = ours.encode_pair(a, b, max_length=max_length, truncation=truncation)
            assert got.input_ids == want["input_ids"], (a, b, max_length)
            assert got.token_type_ids == want["token_type_ids"], (a, b, max_length)
            assert len(got.input_ids) <= max_length


def test_offsets_word_ids_and_sequence_ids_match_transformers(ours_and_ref):
    ours, ref = ours_and_ref
    for text in PROBES + CORPUS[:7]:
        want = ref(text, return_offsets_mapping=True)
        got = ours.encode_with_offsets(text)
        assert got.input_ids == want["input_ids"] == ours.encode(text)
        assert got.offsets == want["offset_mapping"], text
        assert got.word_ids == want.word_ids() and got.sequence_ids == want.sequence_ids()
        cut = ours.encode_with_offsets(text, max_length=6)
        assert cut == ours._encoding(ours.backend.encode(text), 6, "only_first")
        assert cut.input_ids == ref(text, truncation=True, max_length=6)["input_ids"]
    for question, context in PAIRS:
        want = ref(question, context, return_offsets_mapping=True)
        got = ours.encode_pair(question, context)
        assert got.offsets == want["offset_mapping"]
        assert got.word_ids == want.word_ids() and got.sequence_ids == want.sequence_ids()
    # The offsets of a context token are characters of the context, accents and all.
    context = "Café naïve, résumé!"
    got = ours.encode_pair("where?", context)
    pieces = [context[s:e] for (s, e), q in zip(got.offsets, got.sequence_ids) if q == 1]
    assert "".join(pieces) == context.replace(" ", "")
    specials = [t for t, q in enumerate(got.sequence_ids) if q is None]
    assert [got.offsets[t] for t in specials] == [(0, 0)] * 3
    assert [got.word_ids[t] for t in specials] == [None] * 3


def test_encode_words_matches_transformers(ours_and_ref):
    ours, ref = ours_and_ref
    sentences = [
        ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
        ["Antidisestablishmentarianism", "is", "long", ",", "São", "Paulo", "too"],
        ["e-mail", "someone@example.com", "3.14", "(parentheses)", "🙂🎉", "東京は"],
        ["a", "\u200b", "zero", "\x07", "width", "[MASK]", "x" * 120],
    ]
    for words in sentences:
        want = ref(words, is_split_into_words=True, return_offsets_mapping=True)
        got = ours.encode_words(words)
        assert got.input_ids == want["input_ids"], words
        assert got.word_ids == want.word_ids(), words
        assert got.offsets == want["offset_mapping"], words
        cut = ours.encode_words(words, max_length=5)
        assert cut.input_ids == ref(words, is_split_into_words=True, truncation=True,
                                    max_length=5)["input_ids"]
        assert cut.word_ids == got.word_ids[:4] + [None]
    assert 1 not in ours.encode_words(sentences[3]).word_ids  # "\u200b" normalizes to nothing
    with pytest.raises(TypeError, match="list of strings"):
        ours.encode_words("one string")


def test_max_length_must_leave_room_for_special_tokens(ours_and_ref):
    ours, _ = ours_and_ref
    with raises(ValueError, "max_length=2", "3"):  # a pair needs [CLS] and two [SEP]
        ours.encode_pair("a", "b", max_length=2)
    with raises(ValueError, "max_length=1", "2"):
        ours.encode_with_offsets("a", max_length=1)
    assert ours.encode_with_offsets("a b c", max_length=2).input_ids == [ours.cls_id,
                                                                          ours.sep_id]


# ---- the algorithm in plain code ---------------------------------------------------------

def _backend_pieces(tok, word):
    return [t.value for t in tok.backend.model.tokenize(word)]


def _words(tok, texts):
    seen = set()
    for text in texts:
        normalized = tok.backend.normalizer.normalize_str(text)
        for w, _ in tok.backend.pre_tokenizer.pre_tokenize_str(normalized):
            seen.add(w)
    return sorted(seen)


def test_pure_python_wordpiece_equals_the_rust_backend_on_every_word():
    import random

    from minibert.data.tokenizer import wordpiece

    rng = random.Random(0)
    stems = ["walk", "talk", "believ", "understand", "nation", "photo", "graph", "run"]
    ends = ["", "s", "ing", "ed", "able", "er", "ers", "ation", "ally"]
    texts = [" ".join(rng.choice(["un", "re", ""]) + rng.choice(stems) + rng.choice(ends)
                      for _ in range(30)) for _ in range(200)]
    tok = Tokenizer.train_from_iterator(texts, vocab_size=80, use_cache=False)
    vocab = tok.backend.get_vocab()
    # Unseen words too: letters the vocabulary lacks ([UNK]), and one over 100 characters.
    words = _words(tok, texts) + ["zyzzyva", "walkingx", "ü", "a" * 101, "graphs" * 17]
    split = 0
    for w in words:
        assert wordpiece(w, vocab) == _backend_pieces(tok, w), w
        split += len(wordpiece(w, vocab)) > 1
    assert split > len(words) / 3  # the test data does exercise the ## rule


def test_wordpiece_on_every_word_of_wikitext_valid():
    """The whole WikiText-2 validation split, with a vocabulary trained on it."""
    from pathlib import Path

    from minibert.data.tokenizer import wordpiece

    valid = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2" / "valid.txt"
    if not valid.is_file():
        pytest.skip("WikiText-2 is not on this machine")
    lines = valid.read_text(encoding="utf-8").splitlines()
    tok = Tokenizer.train_from_iterator(lines, vocab_size=2000, use_cache=False)
    vocab = tok.backend.get_vocab()
    words = _words(tok, lines)
    assert len(words) > 10_000
    assert all(wordpiece(w, vocab) == _backend_pieces(tok, w) for w in words)


def test_explain_shows_each_stage():
    tok = Tokenizer.train_from_iterator(["walking talking walked talker"] * 50,
                                                 vocab_size=40, use_cache=False)
    e = tok.explain("Walking, TALKED!")
    assert e.normalized == "walking, talked!"
    assert e.words == ["walking", ",", "talked", "!"]
    assert [p for ps in e.pieces for p in ps] == \
        [tok.id_to_token(i) for i in e.ids[1:-1]]  # the pieces are the ids, in order
    assert e.ids == tok.encode("Walking, TALKED!")


# ---- loading what others made: no post-processor, tokenizer_config.json -----------------

SMALL_VOCAB = list(SPECIAL_TOKENS) + ["the", "cat", "sat", "on", "dog", "city", "##s", "東京",
                                      "東", "##京"] + list("abcdefghijklmnopqrstuvwxyz.,")


def _vocab_folder(folder, vocab=SMALL_VOCAB, config=None):
    """A BERT checkpoint's tokenizer files: vocab.txt, and tokenizer_config.json if given."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    if config is not None:
        (folder / "tokenizer_config.json").write_bytes(config)
    return folder


def _without_post_processor(vocab=SMALL_VOCAB):
    """A tokenizer made with the `tokenizers` library directly: BERT's normalizer,
    pre-tokenizer and WordPiece model, but no post-processor."""
    import tokenizers
    from tokenizers import models, normalizers, pre_tokenizers

    backend = tokenizers.Tokenizer(
        models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    assert backend.post_processor is None
    return backend


def test_tokenizer_without_post_processor_gets_berts_template(tmp_path, caplog):
    """Without a post-processor, encode() would give no [CLS] and [SEP]: a classifier would
    pool an ordinary token. BERT's template is attached, with a warning, whether the
    tokenizer is wrapped directly or loaded from its tokenizer.json."""
    reference = Tokenizer.from_pretrained(_vocab_folder(tmp_path / "vocab"))
    (tmp_path / "bare").mkdir()
    _without_post_processor().save(str(tmp_path / "bare" / "tokenizer.json"))
    with caplog.at_level("WARNING", logger="minibert.data.tokenizer"):
        wrapped = Tokenizer(_without_post_processor())
        loaded = Tokenizer.from_pretrained(tmp_path / "bare")
    assert caplog.text.count("attached BERT's template") == 2
    pair = loaded.encode_pair("the cats", "a dog")
    assert [loaded.id_to_token(i) for i in pair.input_ids] == \
        ["[CLS]", "the", "cat", "##s", "[SEP]", "a", "dog", "[SEP]"]
    assert pair.token_type_ids == [0, 0, 0, 0, 0, 1, 1, 1]
    texts = ["The cat sat on a dog.", "東京 city", "", "zz top"]
    for tok in (wrapped, loaded):
        assert [tok.encode(t) for t in texts] == [reference.encode(t) for t in texts]
        for a in texts:
            for b in texts[:2]:
                got, want = tok.encode_pair(a, b), reference.encode_pair(a, b)
                assert (got.input_ids, got.token_type_ids) == \
                    (want.input_ids, want.token_type_ids), (a, b)
    # Saved, the template is part of tokenizer.json: it reloads without a warning.
    loaded.save(tmp_path / "saved")
    caplog.clear()
    with caplog.at_level("WARNING", logger="minibert.data.tokenizer"):
        again = Tokenizer.from_pretrained(tmp_path / "saved")
    assert "attached" not in caplog.text
    assert again.fingerprint == loaded.fingerprint
    assert again.encode_pair("the cats", "a dog") == pair


def test_tokenizer_without_post_processor_or_cls_is_refused(tmp_path):
    """BERT's template needs [CLS] and [SEP]: a vocabulary without them is refused, and
    from_pretrained names the file."""
    no_cls = [t for t in SMALL_VOCAB if t != "[CLS]"]
    with raises(ValueError, "special token", "['[CLS]']"):
        Tokenizer(_without_post_processor(no_cls))
    (tmp_path / "bare").mkdir()
    _without_post_processor(no_cls).save(str(tmp_path / "bare" / "tokenizer.json"))
    with raises(ValueError, str(tmp_path / "bare" / "tokenizer.json"), "special token",
                "['[CLS]']"):
        Tokenizer.from_pretrained(tmp_path / "bare")


@pytest.mark.parametrize("chinese_chars", [True, False])
def test_tokenize_chinese_chars_from_config_matches_transformers(tmp_path, chinese_chars):
    """`tokenize_chinese_chars` (which `save` writes) decides whether CJK characters are
    split one by one; transformers reads it from tokenizer_config.json, and so must we."""
    transformers = pytest.importorskip("transformers")
    config = json.dumps({"do_lower_case": True, "tokenize_chinese_chars": chinese_chars})
    folder = _vocab_folder(tmp_path / "vocab", config=config.encode())
    ref = transformers.BertTokenizerFast.from_pretrained(str(folder))
    ours = Tokenizer.from_pretrained(folder)
    texts = ["the city 東京", "東京city", "a 東京東 dog", "東"]
    assert [ours.encode(t) for t in texts] == ref(texts)["input_ids"]
    assert (SMALL_VOCAB.index("東京") in ours.encode("the city 東京")) == (not chinese_chars)
    # The setting concerns CJK characters, not casing: a `lowercase` argument keeps it.
    assert Tokenizer.from_pretrained(folder, lowercase=True).encode(texts[0]) == \
        ours.encode(texts[0])
    ours.save(tmp_path / "saved")
    (tmp_path / "saved" / "tokenizer.json").unlink()  # load from vocab.txt and the config
    assert [Tokenizer.from_pretrained(tmp_path / "saved").encode(t) for t in texts] == \
        ref(texts)["input_ids"]


@pytest.mark.parametrize("content, problem", [
    (b"", ["JSON"]),
    (b"{not json", ["JSON"]),
    (b"[]", ["JSON object", "list"]),
    (b"\xff\xfe{}", ["UTF-8"]),
    (b'{"do_lower_case": "false"}', ['"do_lower_case"', "'false'", "string", "true or false"]),
    (b'{"strip_accents": 0}', ['"strip_accents"', "0", "number"]),
    (b'{"tokenize_chinese_chars": "no"}', ['"tokenize_chinese_chars"', "'no'"]),
])
def test_malformed_tokenizer_config_is_named(tmp_path, content, problem):
    """One ValueError that names the file, the problem (and the key) and what to do."""
    folder = _vocab_folder(tmp_path, config=content)
    with raises(ValueError, str(folder / "tokenizer_config.json"), "Tokenizer.save") as err:
        Tokenizer.from_pretrained(folder)
    assert_carries(without(str(err.value), folder), *problem)


_TRAIN_AND_HASH = """
import hashlib, sys
from minibert.data.tokenizer import Tokenizer
tok = Tokenizer.train([sys.argv[1]], vocab_size=int(sys.argv[2]), min_frequency=1,
                      limit_alphabet=int(sys.argv[3]), use_cache=False)
tok.save(sys.argv[4])
print(hashlib.sha256(open(sys.argv[4] + "/tokenizer.json", "rb").read()).hexdigest())
"""


@pytest.mark.parametrize("limit_alphabet", [1000, 12])
def test_the_same_corpus_trains_the_same_vocabulary_in_every_process(tmp_path, limit_alphabet):
    """The same command, the same vocabulary: not only through the cache, but on a fresh
    machine too. The Rust trainer numbers its continuation pieces ("##a") and cuts its
    alphabet in the order of a hash map seeded anew in each process, and those numbers
    break ties between equally frequent merges; so each process, with its own seed, is a
    fresh draw. Ties abound here: 400 words of random letters, most seen once or twice,
    and 26 letters with an alphabet limit of 12."""
    import random
    import subprocess
    import sys

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7)))
             for _ in range(400)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choices(words, k=12)) for _ in range(60)),
                      encoding="utf-8")
    script = tmp_path / "train.py"
    script.write_text(_TRAIN_AND_HASH, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    hashes = {subprocess.run([sys.executable, str(script), str(corpus), "150",
                              str(limit_alphabet), str(tmp_path / f"tok{i}")],
                             capture_output=True, text=True, check=True, env=env).stdout
              for i in range(5)}
    assert len(hashes) == 1, f"{len(hashes)} different vocabularies from 5 trainings"


def test_a_trained_vocabulary_is_laid_out_as_berts(trained):
    """Specials, the alphabet, then each "##" piece of a character that continues a word,
    both in code-point order, then the merges. Training numbers the "##" pieces itself
    (not the trainer, in hash order), so it must foresee every one the trainer makes,
    across scripts, accents, CJK (always alone), emoji and punctuation (never continuing)."""
    ids = trained.backend.get_vocab()
    vocab = sorted(ids, key=ids.get)
    n = len(SPECIAL_TOKENS)
    assert vocab[:n] == list(SPECIAL_TOKENS)
    singles = [t for t in vocab if len(t) == 1]
    pieces = [t for t in vocab if len(t) == 3 and t.startswith("##")]
    assert vocab[n:n + len(singles) + len(pieces)] == sorted(singles) + sorted(pieces)
    assert {"##a", "##0"} <= set(pieces) and "##!" not in pieces and "##東" not in pieces
    words = Counter(w for text in CORPUS for w, _ in trained.backend.pre_tokenizer
                    .pre_tokenize_str(trained.backend.normalizer.normalize_str(text)))
    assert set(pieces) == {"##" + c for w in words for c in w[1:]}
