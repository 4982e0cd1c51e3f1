"""Reading a corpus folder: which layout it has, refusing mixed folders, and the report."""
from pathlib import Path

import pytest

from facts import raises
from minibert.data import Corpus, CorpusFile, load_corpus, load_text_folder, load_wikitext

WIKI = " = Alpha = \n Alpha is a letter . \n = = History = = \n Old . \n = Beta = \n Beta too . \n"


def text_docs(prefix: str, n: int) -> str:
    return "\n\n".join(f"{prefix} document {i}\nits second line" for i in range(n)) + "\n"


def write(folder: Path, files: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


@pytest.mark.parametrize("names", [
    {s: f"wiki.{s}.raw" for s in ("train", "valid", "test")},
    {s: f"wiki.{s}.tokens" for s in ("train", "valid", "test")},
    {s: f"{s}.txt" for s in ("train", "valid", "test")},
    {s: f"{s}.txt" for s in ("valid", "test")},  # splits may be missing
])
def test_an_exact_wikitext_layout_is_wikitext(tmp_path, names):
    folder = write(tmp_path, {name: WIKI for name in names.values()})
    write(folder, {"README": "not text", "wikitext.zip": "", "notes.json": "{}"})  # not read
    corpus = load_corpus(folder)
    assert isinstance(corpus, Corpus) and corpus.layout == "wikitext" and corpus.path == folder
    assert {s: list(docs) for s, docs in corpus.splits.items()} == load_wikitext(folder)
    assert corpus.files == [CorpusFile(folder / names[s], s, 2, len("= Alpha =\nAlpha is a "
                                       "letter .\n= = History = =\nOld .") + len("= Beta =\n"
                                       "Beta too ."))
                            for s in ("train", "valid", "test") if s in names]


def test_a_folder_of_other_txt_files_is_a_text_folder(tmp_path):
    folder = write(tmp_path, {"b.txt": text_docs("b", 25), "a.txt": text_docs("a", 5),
                              "README.md": "# about"})
    corpus = load_corpus(folder, holdout_every=10)
    assert corpus.layout == "text folder"
    assert {s: list(docs) for s, docs in corpus.splits.items()} == \
        load_text_folder(folder, holdout_every=10)
    assert len(corpus.splits["valid"]) == 3 and len(corpus.splits["train"]) == 27
    chars = {p: len(text_docs(p, n).strip()) - 2 * (n - 1) for p, n in (("a", 5), ("b", 25))}
    assert corpus.files == [CorpusFile(folder / "a.txt", "train+valid", 5, chars["a"]),
                            CorpusFile(folder / "b.txt", "train+valid", 25, chars["b"])]


def test_report_has_one_line_per_file_then_per_split(tmp_path):
    folder = write(tmp_path, {"train.txt": WIKI * 3, "valid.txt": WIKI})
    lines = load_corpus(folder).report()
    assert lines[0] == f"wikitext corpus in {folder}: 2 files"
    assert lines[1] == f"  {folder / 'train.txt'} -> train: 6 documents, 210 characters"
    assert lines[2] == f"  {folder / 'valid.txt'} -> valid: 2 documents, 70 characters"
    assert lines[3:] == ["  split train: 6 documents, 210 characters",
                         "  split valid: 2 documents, 70 characters"]


def test_wikitext_names_beside_other_text_files_are_refused(tmp_path):
    """The folder that once trained on 8,104 tokens: valid.txt made it 'WikiText', and the
    964 KB corpus_a.txt beside it was dropped without a word."""
    folder = write(tmp_path, {"valid.txt": WIKI, "test.txt": WIKI,
                              "corpus_a.txt": text_docs("a", 50)})
    with pytest.raises(ValueError) as err:
        load_corpus(folder)
    msg = str(err.value)
    for words in ("mixes", "WikiText", "test.txt", "valid.txt", "corpus_a.txt", "rename"):
        assert words in msg, words


def test_two_wikitext_layouts_in_one_folder_are_refused(tmp_path):
    folder = write(tmp_path, {"wiki.train.raw": WIKI, "wiki.train.tokens": WIKI})
    with raises(ValueError, str(folder), "wiki.train.raw", "wiki.train.tokens"):
        load_corpus(folder)


def test_a_text_file_the_text_layout_would_not_read_is_refused(tmp_path):
    folder = write(tmp_path, {"a.txt": text_docs("a", 30), "extra.raw": text_docs("x", 3)})
    with raises(ValueError, str(folder), "extra.raw", ".txt"):
        load_corpus(folder)


def test_text_files_in_subfolders_are_never_silently_ignored(tmp_path):
    folder = write(tmp_path / "mine", {"corpus_a.txt": text_docs("a", 50)})
    write(folder / "wikitext-2", {"train.txt": WIKI, "valid.txt": WIKI})
    with pytest.raises(ValueError) as err:
        load_corpus(folder)
    msg = str(err.value)
    for words in ("corpus_a.txt", "wikitext-2", "train.txt", "valid.txt", "subfolder"):
        assert words in msg, words
    # Hidden folders (editor or notebook leftovers) are not part of the corpus.
    write(tmp_path / "plain" / ".ipynb_checkpoints", {"a-checkpoint.txt": "old"})
    write(tmp_path / "plain", {"a.txt": text_docs("a", 30)})
    assert load_corpus(tmp_path / "plain").layout == "text folder"


def test_a_parent_of_exactly_one_corpus_folder_reads_that_folder(tmp_path):
    inner = write(tmp_path / "cache" / "wikitext-2-raw", {"wiki.valid.raw": WIKI})
    (tmp_path / "cache" / "tokens").mkdir()  # no text files: not a candidate
    corpus = load_corpus(tmp_path / "cache")
    assert corpus.layout == "wikitext" and corpus.path == inner
    assert corpus.files[0].path == inner / "wiki.valid.raw"
    write(tmp_path / "cache" / "wikitext-103-raw", {"wiki.valid.raw": WIKI})
    with raises(ValueError, "wikitext-103-raw/", "wikitext-2-raw/"):
        load_corpus(tmp_path / "cache")


def test_missing_empty_or_file_paths_say_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_corpus(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with raises(FileNotFoundError, str(tmp_path / "empty"), "*.txt"):
        load_corpus(tmp_path / "empty")
    write(tmp_path, {"one.txt": text_docs("a", 30)})
    with raises(NotADirectoryError, str(tmp_path / "one.txt"), "folder"):
        load_corpus(tmp_path / "one.txt")
    with raises(ValueError, str(tmp_path / "blank"), "valid.txt", "no text"):
        load_corpus(write(tmp_path / "blank", {"valid.txt": " \n \n"}))
    with raises(ValueError, str(tmp_path / "small"), "3 documents", "at least 20"):
        load_corpus(write(tmp_path / "small", {"a.txt": text_docs("a", 3)}))


def test_upper_case_txt_files_are_read_too(tmp_path):
    folder = write(tmp_path, {"A.TXT": text_docs("a", 10), "b.txt": text_docs("b", 10)})
    assert len(load_text_folder(folder, holdout_every=5)["train"]) == 16
    assert [f.path.name for f in load_corpus(folder, holdout_every=5).files] == ["A.TXT",
                                                                                  "b.txt"]


SHARED_WIKITEXT = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "wikitext-2"


@pytest.mark.skipif(not SHARED_WIKITEXT.is_dir(), reason="WikiText-2 sample not present")
def test_the_wikitext2_sample_folder(tmp_path):
    corpus = load_corpus(SHARED_WIKITEXT)
    assert corpus.layout == "wikitext" and [f.split for f in corpus.files] == ["valid", "test"]
    assert corpus.files[0].n_documents == 60


def test_a_split_streams_from_disk_and_can_be_read_again(tmp_path):
    folder = write(tmp_path / "c", {"a.txt": text_docs("a", 12), "b.txt": text_docs("b", 18)})
    corpus = load_corpus(folder, holdout_every=10)
    train, valid = corpus.splits["train"], corpus.splits["valid"]
    assert list(train) == list(train) == load_text_folder(folder, holdout_every=10)["train"]
    assert list(valid) == ["a document 9\nits second line", "b document 7\nits second line",
                           "b document 17\nits second line"]
    assert (len(train), len(valid)) == (27, 3)
    assert valid.n_chars == sum(map(len, valid)) and train.n_chars == sum(map(len, train))
    assert train.fingerprint != valid.fingerprint and len(train.fingerprint) == 16
    # The files are read when the split is iterated, not when the folder is loaded.
    (folder / "b.txt").write_text(text_docs("c", 18))
    assert list(valid)[1] == "c document 7\nits second line"


def _corpus_of(folder: Path, megabytes: float) -> Path:
    """A folder of 4 text files, `megabytes` in all, of varied documents."""
    import random
    rng = random.Random(0)
    words = [f"w{i}" + "x" * (i % 7) for i in range(3000)]
    doc = 0
    for f in range(4):
        with open(folder / f"part{f}.txt", "w") as out:
            while out.tell() < megabytes * 2**20 / 4:
                out.write(" ".join(rng.choices(words, k=rng.randint(50, 400))) + f" {doc}\n\n")
                doc += 1
    return folder


def _peak_python_memory_to_prepare(folder: Path, cache: Path) -> tuple[int, int]:
    """(peak bytes Python allocated, characters of train) for load_corpus, tokenizer training
    and tokenizing the train split, with 64 KiB reads."""
    import tracemalloc

    from minibert import Tokenizer
    from minibert.data import tokenize_to_memmap
    from minibert.data.text import iter_text_chunks

    chunk = iter_text_chunks.__defaults__
    iter_text_chunks.__defaults__ = (1 << 16,)  # small reads, so that they do not dominate
    try:
        tracemalloc.start()
        corpus = load_corpus(folder)
        tok = Tokenizer.train_from_iterator(corpus.splits["train"], vocab_size=400,
                                            cache_dir=cache)
        tokens = tokenize_to_memmap(corpus.splits["train"], tok, cache / "train.tok")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        iter_text_chunks.__defaults__ = chunk
    assert tokens.n_docs == len(corpus.splits["train"])
    return peak, sum(map(len, corpus.splits["train"]))


def test_preparing_a_folder_holds_no_split_in_memory(tmp_path):
    """load_corpus, tokenizer training and tokenizing: Python's peak memory is the same for a
    corpus four times bigger, and far below its size (a split read into a list is all of it)."""
    small = _peak_python_memory_to_prepare(_corpus_of(write(tmp_path / "s", {}), 2),
                                           tmp_path / "cs")
    big = _peak_python_memory_to_prepare(_corpus_of(write(tmp_path / "b", {}), 8),
                                         tmp_path / "cb")
    assert big[1] > 3.8 * small[1]
    assert big[0] < 1.2 * small[0] and big[0] < 0.75 * big[1], (small, big)


def test_a_sample_of_a_split_is_spread_over_all_of_it(tmp_path):
    folder = write(tmp_path / "c", {"a.txt": text_docs("a", 20), "b.txt": text_docs("b", 20)})
    train = load_corpus(folder, holdout_every=10).splits["train"]
    whole = list(train)
    sample = train.sample(train.n_chars // 4)
    assert sample.k == 4 or sample.k == 5
    assert list(sample) == list(sample) == whole[::sample.k]
    assert list(sample)[-1].startswith("b document")  # from the last file too, not the first
    assert list(train.sample(10**9)) == whole


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_a_utf16_or_utf32_corpus_file_is_refused(tmp_path, encoding):
    """Read as UTF-8, UTF-16 text keeps its words (the normaliser drops the NULs) but loses
    every line break, so a file of documents became one document without a word said."""
    from minibert.data.text import iter_documents

    f = tmp_path / "corpus.txt"
    f.write_bytes("the cat sat\n\nthe dog went\n\na city\n".encode(encoding))
    with raises(ValueError, str(f), "UTF-8", "UTF-16"):
        list(iter_documents(f))
    (tmp_path / "more.txt").write_text("\n\n".join(f"document {i}" for i in range(40)))
    with raises(ValueError, str(f), "UTF-8"):
        load_corpus(tmp_path)


def test_a_corpus_file_with_carriage_returns_only_is_refused(tmp_path):
    """Classic Mac OS line ends (\\r alone) are no line ends to a reader of \\n: the whole
    file would be one line, one document, held in memory at once."""
    from minibert.data.text import iter_lines

    f = tmp_path / "mac.txt"
    for mac in (b"the cat sat\r\rthe dog went\r",
                b"the cat sat\r\rthe dog went\r\n",  # one \n at the end, from an editor
                b"one\r\rtwo\r\rthree\nfour\r\rfive\n"):  # \r alone still the most
        f.write_bytes(mac)
        with raises(ValueError, str(f), "\\r", "\\n"):  # the line end found, and the one read
            list(iter_lines(f))
    f.write_bytes(b"windows\r\n\r\nline ends\r\n")  # \r\n is fine
    assert list(iter_lines(f)) == ["windows", "", "line ends"]
    f.write_bytes(b"a stray \r inside\n\nline ends\n")  # \n the most: read as it is
    assert list(iter_lines(f)) == ["a stray \r inside", "", "line ends"]


def test_bytes_that_are_not_utf8_are_refused_with_the_file_line_and_byte(tmp_path):
    """One strict reader for every text file: a bad byte is named where it is, with the way
    to drop such bytes, however far into the file (the reader goes in chunks)."""
    from minibert.data.text import iter_lines, read_text

    f = tmp_path / "corpus.txt"
    good = "".join(f"line {i} caf\u00e9\n" for i in range(1, 400))
    for bad, shown in ((b"\x82", "0x82"), (b"\xc3(", "0xc3"), (b"\xed\xa0\x80", "0xed")):
        f.write_bytes(good.encode() + b"so " + bad + b" bad\nmore\n")
        with raises(ValueError, str(f), "line 400", shown, "not valid UTF-8",
                    f"iconv -f utf-8 -t utf-8 -c {f}"):
            list(iter_lines(f))
        with raises(ValueError, str(f), "line 400", shown):
            read_text(f)
    f.write_bytes(good.encode() + b"cut short \xe2\x82")  # a character cut off at the end
    with raises(ValueError, str(f), "line 400", "0xe2"):
        read_text(f)
    # Valid text is read whole: a character across a chunk's end, a U+FFFD the file holds, a
    # byte-order mark (dropped, as every editor does).
    f.write_bytes(b"\xef\xbb\xbf" + good.encode() + "\ufffd kept\n".encode())
    assert read_text(f) == good + "\ufffd kept\n"
    from minibert.data.text import iter_text_chunks
    assert "".join(iter_text_chunks(f, chunk_bytes=7)) == good + "\ufffd kept\n"
