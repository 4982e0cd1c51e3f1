"""minibert.data.prepare: a corpus made ready once. The token files against the tokenizer run
on the documents directly, the cache shared between runs, and the run's tokenizer: kept on
resume, --init-from's, or refused when a leftover one is another."""

import logging

import pytest

import minibert
import minibert.data.prepare as prepare
from facts import raises
from minibert.data import load_corpus

from engine_utils import wikitext_folder

SPLITS = ("train", "valid")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return wikitext_folder(tmp_path_factory.mktemp("wikitext"), (("train", 30), ("valid", 6)))


def test_prepared_splits_are_the_documents_tokenized(data_dir, tmp_path):
    run, cache = tmp_path / "run", tmp_path / "cache"
    prepared = prepare.prepare_corpus(run, SPLITS, 32, data_dir=data_dir, cache_dir=cache,
                                      vocab_size=120)
    tok = prepared.tokenizer
    assert not run.exists()  # the run's part is written by save_prepared, once it may be
    prepare.save_prepared(run, prepared)
    data = prepare.load_prepared(run, SPLITS, seq_len=32, cache_dir=cache)
    assert data.tokenizer.fingerprint == tok.fingerprint
    assert data.keys == prepared.keys
    assert minibert.Tokenizer.from_pretrained(run / "tokenizer").fingerprint == tok.fingerprint
    corpus = load_corpus(data_dir)  # read again, independently of the run
    for split in SPLITS:
        docs = list(corpus.splits[split])
        assert data.keys[split] == corpus.splits[split].fingerprint
        tokens = data.splits[split].tokens
        assert tokens.n_docs == len(docs)
        for d in (0, len(docs) - 1):
            ids = tokens.ids[tokens.doc_offsets[d]:tokens.doc_offsets[d + 1]].tolist()
            assert ids == tok.encode(docs[d], add_special_tokens=False)
        block = data.splits[split][0]["input_ids"]
        assert block[0] == tok.cls_id and block[-1] == tok.sep_id and len(block) <= 32


def test_a_second_run_reuses_the_token_files(data_dir, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    prepare.prepare_corpus(tmp_path / "a", SPLITS, data_dir=data_dir, cache_dir=cache,
                           vocab_size=120)
    files = sorted((cache / "tokens").glob("*.tok"))
    assert len(files) == 2
    calls = []
    monkeypatch.setattr(prepare, "tokenize_to_memmap", lambda *a, **k: calls.append(a))
    prepare.prepare_corpus(tmp_path / "b", SPLITS, data_dir=data_dir, cache_dir=cache,
                           vocab_size=120)
    assert calls == [] and sorted((cache / "tokens").glob("*.tok")) == files
    with raises(FileNotFoundError, "'test'", str(data_dir)):

        prepare.prepare_corpus(tmp_path / "c", ("train", "test"), data_dir=data_dir,
                               cache_dir=cache)


def test_the_runs_tokenizer(data_dir, tmp_path, caplog, monkeypatch):
    cache = tmp_path / "cache"
    train = load_corpus(data_dir).splits["train"]
    first = prepare.run_tokenizer(tmp_path / "run", train, vocab_size=120, cache_dir=cache)
    assert not (tmp_path / "run").exists()  # made, not written: save_prepared writes it
    first.save(tmp_path / "run" / "tokenizer")
    # A resumed run keeps its own, whatever the flags now say.
    kept = prepare.run_tokenizer(tmp_path / "run", train, vocab_size=60, resume=True,
                                 cache_dir=cache)
    assert kept.fingerprint == first.fingerprint
    # A new start that would make another one is refused, naming both.
    with pytest.raises(FileExistsError, match=first.fingerprint[:16]):
        prepare.run_tokenizer(tmp_path / "run", train, vocab_size=100, cache_dir=cache)
    # --init-from's tokenizer is taken as it is, not trained.
    other = minibert.Tokenizer.train_from_iterator(["zebra yak " * 30] * 40, vocab_size=60,
                                                   use_cache=False)
    other.save(tmp_path / "ckpt")
    got = prepare.run_tokenizer(tmp_path / "new", train, init_from=tmp_path / "ckpt")
    assert got.fingerprint == other.fingerprint
    # A big split is sampled: every k-th document, k said in the log.
    monkeypatch.setattr(prepare, "TOKENIZER_SAMPLE_CHARS", 2_000)
    with caplog.at_level(logging.INFO, logger="minibert.data.prepare"):
        prepare.run_tokenizer(tmp_path / "sampled", train, vocab_size=80, cache_dir=cache)
    k = -(-train.n_chars // 2_000)
    assert f"every {prepare._nth(k)} document of train" in caplog.text
    assert [prepare._nth(k) for k in (1, 2, 3, 4, 11, 12, 13, 21, 22, 112)] == \
        ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "112th"]


def test_corpora_that_split_the_same_text_otherwise_differ(tmp_path):
    """The same characters cut into other documents are another corpus: other blocks, so
    another cache key (a key over the text alone reused one corpus's token file for the
    other)."""
    folders = {"two": " = a = \n the cat sat.\n = b = \n on the mat.\n",
               "one": " = a = \n the cat sat.= b = \n on the mat.\n"}
    keys = {}
    for name, text in folders.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.txt").write_text(text)
        (tmp_path / name / "valid.txt").write_text(" = v = \n the dog.\n")
        train = load_corpus(tmp_path / name).splits["train"]
        keys[name] = (len(train), train.fingerprint)
    assert keys["two"][0] == 2 and keys["one"][0] == 1
    assert keys["two"][1] != keys["one"][1]
