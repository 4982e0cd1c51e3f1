"""The memory-mapped token file: contents, atomic writes, and refusing bad files."""
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from facts import raises
from minibert.data import TokenFile, TokenFileError, tokenize_to_memmap
from minibert.data.tokens import HEADER_BYTES, MAGIC
from minibert.data.tokenizer import Tokenizer

DOCS = [
    "The first document has a few words.\nAnd a second line.",
    "Second document: numbers 12 and 345, accents café.",
    "Third one is short.",
    "Fourth document talks about lobsters and the sea, at some length, " * 5,
]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train_from_iterator(DOCS * 5, vocab_size=300, min_frequency=1,
                                         use_cache=False)


@pytest.fixture(scope="module")
def other_tok():
    # The same corpus, cased: another vocabulary (a smaller vocab_size would not do: this
    # corpus runs out of merges at 131 entries, and training gives the same vocabulary)
    return Tokenizer.train_from_iterator(DOCS * 5, vocab_size=300, min_frequency=1,
                                         lowercase=False, use_cache=False)


def test_roundtrip_ids_offsets_and_header(tok, tmp_path):
    tf = tokenize_to_memmap(DOCS, tok, tmp_path / "c.tok")
    expected = [tok.encode(d, add_special_tokens=False) for d in DOCS]
    assert tf.ids.dtype == np.uint16 and isinstance(tf.ids, np.memmap)
    assert len(tf) == len(DOCS) and tf.n_tokens == sum(map(len, expected))
    assert [tf.doc(d).tolist() for d in range(len(tf))] == expected
    assert tf.doc_lengths().tolist() == [len(e) for e in expected]
    reopened = TokenFile.open(tmp_path / "c.tok", tok)
    assert np.array_equal(reopened.ids, tf.ids)
    h = reopened.header
    assert h["format_version"] == 1 and h["dtype"] == "<u2" and h["n_tokens"] == tf.n_tokens
    assert h["tokenizer_fingerprint"] == tok.fingerprint
    assert h["special_ids"] == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    assert list(tmp_path.iterdir()) == [tmp_path / "c.tok"]  # no temporary left


def test_files_are_split_into_documents_at_blank_lines(tok, tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text(f"{DOCS[0]}\n\n\n{DOCS[1]}\n  \n{DOCS[2]}\n", encoding="utf-8")
    tf = tokenize_to_memmap(f, tok, tmp_path / "a.tok")  # a single path
    assert [tf.doc(d).tolist() for d in range(len(tf))] == \
        [tok.encode(d, add_special_tokens=False) for d in DOCS[:3]]
    tf2 = tokenize_to_memmap([f, DOCS[3]], tok, tmp_path / "b.tok")  # Path + str mixed
    assert len(tf2) == 4 and tf2.doc(3).tolist() == tok.encode(DOCS[3], add_special_tokens=False)


def test_file_names_are_read_as_files_like_tokenizer_train(tok, tmp_path, monkeypatch):
    """The same list means the same thing to Tokenizer.train and tokenize_to_memmap:
    a str that names an existing file is that file, never the text of its name."""
    monkeypatch.chdir(tmp_path)
    Path("a.txt").write_text(f"{DOCS[0]}\n\n{DOCS[1]}\n", encoding="utf-8")
    Path("b.txt").write_text(DOCS[2], encoding="utf-8")
    expected = [tok.encode(d, add_special_tokens=False) for d in DOCS[:3]]
    for source in (["a.txt", "b.txt"], [str(tmp_path / "a.txt"), Path("b.txt")]):
        tf = tokenize_to_memmap(source, tok, tmp_path / "x.tok")
        assert [tf.doc(d).tolist() for d in range(len(tf))] == expected, source
    Tokenizer.train(["a.txt", "b.txt"], vocab_size=200, use_cache=False)  # the same files


def test_a_path_like_str_naming_no_file_is_refused(tok, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data dir").mkdir()
    for missing in ["corpus_b.txt", "data/corpus_b", str(tmp_path / "data" / "x.tokens"),
                    "data dir/corpus.raw", "CORPUS.TXT"]:
        # the name, and where a relative one was looked for
        with raises(FileNotFoundError, repr(missing), str(Path.cwd())):
            tokenize_to_memmap(["a document", missing], tok, tmp_path / "x.tok")
    with pytest.raises(IsADirectoryError, match="load_corpus"):
        tokenize_to_memmap(["data/"], tok, tmp_path / "x.tok")
    with raises(FileNotFoundError, "'one text, not a file name'", "[text]"):
        tokenize_to_memmap("one text, not a file name", tok, tmp_path / "x.tok")
    assert not (tmp_path / "x.tok").exists()


def test_short_texts_that_are_not_file_names_stay_texts(tok, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    texts = ["and/or", "http://example.com/a/b.txt", "1/2", "See notes.txt for details",
             "README", "data", "a b.txt", " notes.txt", "", "x" * 5000 + ".txt"]
    tf = tokenize_to_memmap(texts, tok, tmp_path / "x.tok")
    expected = [tok.encode(t, add_special_tokens=False) for t in texts]
    assert [tf.doc(d).tolist() for d in range(len(tf))] == [e for e in expected if e]


def test_uint32_for_large_vocabularies(tok, tmp_path):
    class BigVocab:
        """Duck-typed tokenizer whose ids do not fit in uint16."""
        vocab_size, fingerprint = 70_000, "big"
        pad_id, unk_id, cls_id, sep_id, mask_id = 0, 1, 2, 3, 4

        def encode_batch(self, texts, add_special_tokens=True):
            return [[69_999, 65_536, len(t)] for t in texts]

    tf = tokenize_to_memmap(["a", "bb"], BigVocab(), tmp_path / "big.tok")
    assert tf.ids.dtype == np.uint32 and tf.ids.tolist() == [69_999, 65_536, 1, 69_999, 65_536, 2]


def test_empty_corpus_fails_and_keeps_the_old_file(tok, tmp_path):
    out = tmp_path / "c.tok"
    tokenize_to_memmap(DOCS, tok, out)
    before = out.read_bytes()
    with pytest.raises(ValueError, match="empty"):
        tokenize_to_memmap([], tok, out)
    with pytest.raises(ValueError, match="empty"):
        tokenize_to_memmap(["", "   ", "\x00"], tok, out)
    assert out.read_bytes() == before and list(tmp_path.iterdir()) == [out]


def test_failure_midway_leaves_previous_file_untouched(tok, tmp_path):
    out = tmp_path / "c.tok"
    tokenize_to_memmap(DOCS, tok, out)
    before = out.read_bytes()

    def docs():
        yield from DOCS * 100
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        tokenize_to_memmap(docs(), tok, out, batch_docs=8)
    assert out.read_bytes() == before and list(tmp_path.iterdir()) == [out]


def test_file_from_another_tokenizer_is_refused(tok, other_tok, tmp_path):
    tokenize_to_memmap(DOCS, tok, tmp_path / "c.tok")
    # the file, both tokenizers, and how to make the file again
    with raises(TokenFileError, str(tmp_path / "c.tok"), tok.fingerprint, other_tok.fingerprint,
                "tokenize_to_memmap"):
        TokenFile.open(tmp_path / "c.tok", other_tok)
    TokenFile.open(tmp_path / "c.tok")  # without a tokenizer there is nothing to compare


def test_truncated_or_foreign_files_are_refused(tok, tmp_path):
    path = tmp_path / "c.tok"
    tokenize_to_memmap(DOCS, tok, path)
    data = path.read_bytes()
    cases = [  # what is wrong, and the file's sizes where they are known
        (["truncated", f"{len(data) - 3} bytes", str(len(data))], data[:-3]),
        (["truncated", f"{HEADER_BYTES + 5} bytes"], data[:HEADER_BYTES + 5]),
        (["truncated", "100 bytes", str(HEADER_BYTES)], data[:100]),
        (["magic bytes"], b"hello world" * 1000),
        (["header"], MAGIC + b"{nonsense" + data[len(MAGIC) + 9:]),
    ]
    for facts, content in cases:
        path.write_bytes(content)
        with raises(TokenFileError, str(path), *facts, "tokenize_to_memmap"):
            TokenFile.open(path)
    header = json.loads(data[len(MAGIC):HEADER_BYTES].decode())
    header["format_version"] = 99
    body = json.dumps(header).encode()
    path.write_bytes(MAGIC + body.ljust(HEADER_BYTES - len(MAGIC) - 1) + b"\n"
                     + data[HEADER_BYTES:])
    with raises(TokenFileError, str(path), "format version 99", "tokenize_to_memmap"):
        TokenFile.open(path)
    with raises(FileNotFoundError, str(tmp_path / "absent.tok"), "tokenize_to_memmap"):
        TokenFile.open(tmp_path / "absent.tok")


def test_pickling_reopens_instead_of_copying(tok, tmp_path):
    tf = tokenize_to_memmap(DOCS * 200, tok, tmp_path / "c.tok")
    blob = pickle.dumps(tf)
    assert len(blob) < 2000 < tf.ids.nbytes
    again = pickle.loads(blob)
    assert isinstance(again.ids, np.memmap) and np.array_equal(again.ids, tf.ids)
    assert Path(again.path) == tf.path


def test_bad_utf8_is_refused_and_leaves_no_token_file(tok, tmp_path):
    """A byte that is not UTF-8, past the documents already written: the token file under
    way is dropped whole, as a cache entry must never be half one."""
    f = tmp_path / "text" / "bad.txt"
    f.parent.mkdir()
    f.write_bytes("\n\n".join(DOCS * 50).encode() + b"\n\nsecond \xff\xfe document\n")
    line = ("\n\n".join(DOCS * 50) + "\n\n").count("\n") + 1
    out = tmp_path / "cache" / "c.tok"
    with raises(ValueError, str(f), f"line {line}", "0xff", "iconv"):
        tokenize_to_memmap(f, tok, out, batch_docs=8)
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def _with_header(data: bytes, **changes) -> bytes:
    """``data`` with header fields changed (a value of ... deletes the field)."""
    header = json.loads(data[len(MAGIC):HEADER_BYTES].decode())
    for key, value in changes.items():
        if value is ...:
            del header[key]
        else:
            header[key] = value
    body = json.dumps(header).encode()
    return MAGIC + body.ljust(HEADER_BYTES - len(MAGIC) - 1) + b"\n" + data[HEADER_BYTES:]


def test_every_kind_of_damage_is_a_token_file_error(tok, tmp_path):
    """A cache that finds a damaged token file rebuilds it on TokenFileError; any other
    exception (KeyError, numpy's ValueError, ...) would end the run instead."""
    path = tmp_path / "c.tok"
    tokenize_to_memmap(DOCS * 3, tok, path)
    data = path.read_bytes()
    header = json.loads(data[len(MAGIC):HEADER_BYTES].decode())
    rng = np.random.default_rng(0)
    offsets_at = header["offsets_offset"]
    shuffled_offsets = (data[:offsets_at] + np.arange(header["n_docs"] + 1, dtype="<i8")[::-1]
                        .tobytes())
    cases = {
        **{f"truncated to {n} bytes": data[:n] for n in
           (0, 5, len(MAGIC) + 3, HEADER_BYTES - 1, HEADER_BYTES, HEADER_BYTES + 7,
            offsets_at + 3, len(data) - 1)},
        "random bytes": rng.bytes(len(data)),
        "random bytes after the magic": MAGIC + rng.bytes(len(data) - len(MAGIC)),
        "zeros after the header": data[:HEADER_BYTES] + bytes(len(data) - HEADER_BYTES),
        "header is not an object": MAGIC + b"[1, 2]".ljust(HEADER_BYTES - len(MAGIC))
        + data[HEADER_BYTES:],
        "header lacks file_size": _with_header(data, file_size=...),
        "header lacks dtype": _with_header(data, dtype=...),
        "n_tokens is text": _with_header(data, n_tokens="many"),
        "n_docs is negative": _with_header(data, n_docs=-3),
        "float dtype": _with_header(data, dtype="<f8"),
        "unknown dtype": _with_header(data, dtype="nonsense"),
        "ids beyond the file": _with_header(data, ids_offset=10**12),
        "offsets beyond the file": _with_header(data, offsets_offset=len(data) - 8),
        "offsets out of order": shuffled_offsets,
        "more tokens than ids": _with_header(data, n_tokens=header["n_tokens"] + 1000),
    }
    wrong = {}
    for name, content in cases.items():
        path.write_bytes(content)
        try:
            TokenFile.open(path)
        except TokenFileError as e:
            if "re-prepare" not in str(e) or str(path) not in str(e):
                wrong[name] = f"unhelpful message: {e}"
        except Exception as e:  # noqa: BLE001 - the point is to name whatever else escapes
            wrong[name] = f"{type(e).__name__}: {e}"
        else:
            wrong[name] = "opened without complaint"
    assert not wrong, wrong


def test_a_streamed_split_tokenizes_and_trains_as_its_list(tmp_path, caplog):
    """A `load_corpus` split gives the same token file as its documents in a list, and the
    tokenizer trained on it is the one cached for the list (same key, no second training)."""
    import logging

    from minibert.data import load_corpus

    folder = tmp_path / "texts"
    folder.mkdir()
    for f in range(2):
        (folder / f"{f}.txt").write_text("\n\n".join(
            f"document {f}-{i} about cats , dogs and rain number {i * 7}" for i in range(30)))
    docs = load_corpus(folder).splits["train"]
    listed = list(docs)
    tok = Tokenizer.train_from_iterator(listed, vocab_size=120, cache_dir=tmp_path / "cache")
    with caplog.at_level(logging.INFO, logger="minibert.data.tokenizer_train"):
        again = Tokenizer.train_from_iterator(docs, vocab_size=120, cache_dir=tmp_path / "cache")
    assert "reusing cached tokenizer" in caplog.text and again.fingerprint == tok.fingerprint
    a = tokenize_to_memmap(docs, tok, tmp_path / "streamed.tok")
    b = tokenize_to_memmap(listed, tok, tmp_path / "listed.tok")
    assert a.n_docs == len(docs) == 57
    assert (tmp_path / "streamed.tok").read_bytes() == (tmp_path / "listed.tok").read_bytes()
    assert np.array_equal(a.doc_offsets, b.doc_offsets)


def test_the_text_file_read_is_never_the_output(tok, tmp_path):
    """out_path naming the text it reads (a slip of the command line) would have replaced
    the corpus with its token file."""
    from minibert.data import load_corpus

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = "\n\n".join(f"the cat sat on mat {i}" for i in range(30)) + "\n"
    (corpus / "notes.txt").write_text(text)
    (tmp_path / "link.txt").symlink_to(corpus / "notes.txt")
    split = load_corpus(corpus).splits["train"]
    for source in (corpus / "notes.txt", [str(corpus / "notes.txt")], split):
        for out in (corpus / "notes.txt", tmp_path / "link.txt"):
            with raises(ValueError, "out_path", str(out)):

                tokenize_to_memmap(source, tok, out)
    assert (corpus / "notes.txt").read_text() == text
    assert sorted(p.name for p in corpus.iterdir()) == ["notes.txt"]  # no temporary left
