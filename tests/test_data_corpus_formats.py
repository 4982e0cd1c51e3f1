"""A corpus in any of the formats a folder may hold: .txt, .txt.gz, .jsonl and .jsonl.gz,
read as text folders or as split files, and refused, naming file and line, where it is not
text; then the main job run end to end on such a folder."""
import gzip
import json
import random
from pathlib import Path

import pytest

from engine_utils import WORDS, load_example, quick_runs  # noqa: F401 (fixture)
from facts import assert_carries, raises
from minibert.data import load_corpus
from minibert.data.text import iter_text_chunks

# Documents with what a reader could lose: a second line, characters of two to four bytes.
DOCS = [f"document {i} caf\u00e9 \u4e2d \U0001f600\nits second line {i}" for i in range(30)]


def as_txt(docs: list[str]) -> str:
    return "\n\n".join(docs) + "\n"


def as_jsonl(docs: list[str], field: str = "text") -> str:
    return "".join(json.dumps({"id": i, field: d}) + "\n" for i, d in enumerate(docs))


def write(path: Path, text: str) -> Path:
    """`text` in `path`, gzipped when its name ends in .gz."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.lower().endswith(".gz") else data)
    return path


def read(folder: Path, **kwargs) -> tuple[str, dict[str, list[str]], dict[str, str]]:
    corpus = load_corpus(folder, **kwargs)
    return (corpus.layout, {s: list(d) for s, d in corpus.splits.items()},
            {s: d.fingerprint for s, d in corpus.splits.items()})


@pytest.mark.parametrize("name, text, kwargs", [
    ("corpus.txt.gz", as_txt(DOCS), {}),
    ("corpus.TXT.GZ", as_txt(DOCS), {}),
    ("corpus.jsonl", as_jsonl(DOCS), {}),
    ("corpus.jsonl.gz", as_jsonl(DOCS, "body"), {"text_field": "body"}),
], ids=["txt.gz", "TXT.GZ", "jsonl", "jsonl.gz"])
def test_gzip_and_jsonl_read_as_the_plain_text_of_the_same_documents(tmp_path, name, text,
                                                                     kwargs):
    """The same documents in any format give the same splits, with the same fingerprint (the
    token cache's key): the text as read, not the bytes on disk."""
    plain = read(write(tmp_path / "plain" / "corpus.txt", as_txt(DOCS)).parent, holdout_every=5)
    other = read(write(tmp_path / "other" / name, text).parent, holdout_every=5, **kwargs)
    assert other == plain
    assert plain[0] == "text folder" and len(plain[1]["valid"]) == 6
    assert load_corpus(tmp_path / "other", holdout_every=5, **kwargs).files[0].n_documents == 30


def test_a_gzipped_file_streams_in_pieces_on_line_boundaries(tmp_path):
    text = as_txt(DOCS) * 50
    f = write(tmp_path / "a.txt.gz", text)
    pieces = list(iter_text_chunks(f, chunk_bytes=997))
    assert "".join(pieces) == text and len(pieces) > 10
    assert all(p.endswith("\n") for p in pieces)


def test_jsonl_skips_blank_lines_and_empty_documents(tmp_path):
    lines = [json.dumps({"text": d}) for d in DOCS[:3]]
    text = "\n".join([lines[0], "", "   ", lines[1], json.dumps({"text": ""}),
                      json.dumps({"text": " \n "}), lines[2]]) + "\r\n"
    folder = write(tmp_path / "c" / "a.jsonl", text).parent
    write(folder / "b.txt", as_txt(DOCS[3:]))
    corpus = load_corpus(folder, holdout_every=5)
    assert [f.n_documents for f in corpus.files] == [3, 27]
    assert list(corpus.splits["train"])[:3] == DOCS[:3]


def test_a_folder_of_split_files_gives_the_named_splits(tmp_path):
    folder = tmp_path / "c"
    write(folder / "train.txt.gz", as_txt(DOCS[:20]))
    write(folder / "validation.jsonl", as_jsonl(DOCS[20:25]))
    write(folder / "test.jsonl.gz", as_jsonl(DOCS[25:]))
    write(folder / "README.md", "not read")  # not a corpus file
    corpus = load_corpus(folder)
    assert corpus.layout == "split files"
    assert {s: list(d) for s, d in corpus.splits.items()} == {
        "train": DOCS[:20], "valid": DOCS[20:25], "test": DOCS[25:]}
    assert [(f.path.name, f.split, f.n_documents) for f in corpus.files] == [
        ("train.txt.gz", "train", 20), ("validation.jsonl", "valid", 5),
        ("test.jsonl.gz", "test", 5)]
    assert corpus.report()[0] == f"split files corpus in {folder}: 3 files"
    # Two files of one split are both read, in name order.
    write(folder / "train.jsonl", as_jsonl(["one more"]))
    assert list(load_corpus(folder).splits["train"]) == ["one more"] + DOCS[:20]


def test_the_wikitext_layouts_keep_their_meaning(tmp_path):
    """Uncompressed train.txt and valid.txt are WikiText (articles by their headings), as
    before; the same names compressed are split files of blank-line separated documents."""
    wiki = " = Alpha = \n Alpha is a letter . \n\n Its history . \n = Beta = \n Beta . \n"
    write(tmp_path / "plain" / "train.txt", wiki)
    write(tmp_path / "plain" / "valid.txt", wiki)
    layout, splits, _ = read(tmp_path / "plain")
    assert layout == "wikitext" and len(splits["train"]) == 2
    write(tmp_path / "gz" / "train.txt.gz", wiki)
    write(tmp_path / "gz" / "valid.txt.gz", wiki)
    layout, splits, _ = read(tmp_path / "gz")
    assert layout == "split files" and len(splits["train"]) == 2
    assert splits["train"][0] == " = Alpha = \n Alpha is a letter . "  # a document as written


@pytest.mark.parametrize("files, facts", [
    # A split file beside a file of another corpus: which split would that one be?
    (["train.jsonl", "extra.txt"], ["train.jsonl", "extra.txt", "rename", "my_train.jsonl"]),
    (["valid.txt.gz", "a.txt", "b.jsonl"], ["valid.txt.gz", "a.txt", "b.jsonl"]),
    # A compressed split beside WikiText's uncompressed name, read as articles.
    (["train.txt.gz", "valid.txt"], ["train.txt.gz", "valid.txt", "gzip"]),
    (["train.jsonl.gz", "wiki.valid.raw"], ["train.jsonl.gz", "wiki.valid.raw"]),
])
def test_split_files_beside_other_corpus_files_are_refused(tmp_path, files, facts):
    for name in files:
        write(tmp_path / name, as_jsonl(DOCS) if ".jsonl" in name else as_txt(DOCS))
    with raises(ValueError, str(tmp_path), "would go unread", *facts):
        load_corpus(tmp_path)


@pytest.mark.parametrize("line, facts", [
    ('{"text": "fine"', ["line 3", "not valid JSON", "one JSON object"]),
    ("not json at all", ["line 3", "not valid JSON"]),
    ('["a", "list"]', ["line 3", "a list, not a JSON object"]),
    ('{"id": 7, "body": "x"}', ["line 3", "no 'text' field", "id, body", "text_field="]),
    ('{"text": 5}', ["line 3", "'text' field", "a number, not a string", "text_field="]),
    ('{"text": null}', ["line 3", "'text' field", "null, not a string", "text_field="]),
    ('{"text": ["a", "b"]}', ["line 3", "'text' field", "a list, not a string"]),
    ('{"text": "lone \\ud800 surrogate"}', ["line 3", "'text' field", "surrogate"]),
], ids=["cut", "not json", "list", "no field", "number", "null", "list field", "surrogate"])
def test_a_jsonl_line_that_holds_no_text_is_refused_with_file_line_and_fix(tmp_path, line,
                                                                           facts):
    good = as_jsonl(DOCS[:2])
    for name in ("a.jsonl", "a.jsonl.gz"):
        f = write(tmp_path / name[2:] / name, good + line + "\n" + as_jsonl(DOCS))
        with raises(ValueError, str(f), *facts):
            load_corpus(f.parent)


def test_another_text_field_is_named_in_the_message(tmp_path):
    f = write(tmp_path / "a.jsonl", as_jsonl(DOCS, "body"))
    with raises(ValueError, str(f), "line 1", "no 'text' field", "id, body", "text_field="):
        load_corpus(tmp_path)
    with raises(ValueError, str(f), "line 1", "no 'content' field", "id, body"):
        load_corpus(tmp_path, text_field="content")
    assert len(load_corpus(tmp_path, text_field="body").splits["train"]) == 29


@pytest.mark.parametrize("damage", ["truncated", "not gzip", "flipped"])
def test_a_damaged_gzip_file_is_refused_naming_it(tmp_path, damage):
    data = gzip.compress((as_txt(DOCS) * 200).encode(), mtime=0)
    if damage == "truncated":  # a download cut short
        data = data[:len(data) // 2]
    elif damage == "not gzip":  # plain text under a .gz name
        data = as_txt(DOCS).encode()
    else:  # a byte changed in the compressed stream, or in the CRC at its end
        data = data[:-8] + bytes([data[-8] ^ 0xFF]) + data[-7:]
    f = tmp_path / "corpus.txt.gz"
    f.write_bytes(data)
    with raises(ValueError, str(f), "gzip", f"gzip -t {f}") as err:
        load_corpus(tmp_path)
    assert "\n" not in str(err.value)


def test_bytes_that_are_not_utf8_in_a_gzipped_file_are_named_with_the_line(tmp_path):
    f = write(tmp_path / "corpus.txt.gz", "")
    f.write_bytes(gzip.compress(as_txt(DOCS).encode() + b"bad \xff byte\n"))
    with raises(ValueError, str(f), "line 90", "0xff", f"zcat {f} | iconv",
                str(tmp_path / "corpus.utf8.txt.gz")):
        load_corpus(tmp_path)


# ---- the main job ---------------------------------------------------------------------------
pretrain = load_example("pretrain_wikitext")


def _args(data_dir: Path, out: Path, cache: Path, *extra: str) -> list[str]:
    return ["--data-dir", str(data_dir), "--out", str(out), "--cache-dir", str(cache),
            "--preset", "tiny", "--vocab-size", "200", "--seq-len", "32", "--batch-size", "8",
            "--max-steps", "2", "--no-progress", "--eval-batches", "1", "--precision", "fp32",
            *extra]


def _documents(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 90))) for _ in range(n)]


def test_the_main_job_trains_on_gzipped_split_files_with_a_text_field(tmp_path):
    folder = tmp_path / "corpus"
    write(folder / "train.jsonl.gz", as_jsonl(_documents(80, 0), "content"))
    write(folder / "valid.txt.gz", as_txt(_documents(10, 1)))
    out = tmp_path / "run"
    assert pretrain.main(_args(folder, out, tmp_path / "cache", "--text-field", "content")) == 0
    assert json.loads((out / "eval.json").read_text())["steps"] == 2


def test_a_corpus_that_is_not_text_exits_2_before_out_is_made(tmp_path, capsys):
    folder = tmp_path / "corpus"
    write(folder / "train.jsonl.gz", as_jsonl(_documents(80, 0), "content"))
    write(folder / "valid.txt.gz", as_txt(_documents(10, 1)))
    out = tmp_path / "run"
    cases = [([], [str(folder / "train.jsonl.gz"), "line 1", "no 'text' field", "id, content",
                   "--text-field"]),
             (["--text-field", "id"], ["line 1", "'id' field", "a number", "--text-field"])]
    for extra, facts in cases:
        assert pretrain.main(_args(folder, out, tmp_path / "cache", *extra)) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err, err
        assert_carries(err, *facts)
        assert "text_field=" not in err
    (folder / "valid.txt.gz").write_bytes(b"\x1f\x8b\x08\x00 cut")
    assert pretrain.main(_args(folder, out, tmp_path / "cache", "--text-field", "content")) == 2
    assert_carries(capsys.readouterr().err, str(folder / "valid.txt.gz"), "gzip")
    assert not out.exists()


def test_text_field_has_help(capsys):
    with pytest.raises(SystemExit):
        pretrain.parse_args(["--help"])
    assert_carries(capsys.readouterr().out, "--text-field", "jsonl")


def test_split_files_without_the_eval_split_say_how_to_hold_one_out(tmp_path, capsys):
    folder = tmp_path / "corpus"
    write(folder / "train.jsonl", as_jsonl(_documents(80, 0)))
    assert pretrain.main(_args(folder, tmp_path / "run", tmp_path / "cache")) == 2
    assert_carries(capsys.readouterr().err, "'valid'", "found: train", "--eval-split",
                   "corpus.jsonl")
    assert not (tmp_path / "run").exists()


def test_a_resume_compares_the_documents_that_text_field_chose(tmp_path, capsys):
    """--text-field is part of the run only through the text it reads: another field with
    other documents is refused, a field of the same documents under another name is not."""
    folder, cache, out = tmp_path / "corpus", tmp_path / "cache", tmp_path / "run"
    docs, other = _documents(80, 0), _documents(80, 2)
    write(folder / "train.jsonl.gz", "".join(json.dumps({"a": d, "b": o, "c": d}) + "\n"
                                             for d, o in zip(docs, other)))
    write(folder / "valid.txt.gz", as_txt(_documents(10, 1)))
    assert pretrain.main(_args(folder, out, cache, "--text-field", "a")) == 0
    assert pretrain.main(_args(folder, out, cache, "--text-field", "b", "--resume",
                               "--max-steps", "3")) == 2
    assert_carries(capsys.readouterr().err, "--train-split train", "--text-field")
    assert pretrain.main(_args(folder, out, cache, "--text-field", "c", "--resume",
                               "--max-steps", "3")) == 0
    assert json.loads((out / "eval.json").read_text())["steps"] == 3
