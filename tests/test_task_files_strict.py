"""minibert.data.task_files reads strictly: no first match, no truthiness, no lenient parse.

Each test writes a small file that an earlier reader took silently and read wrongly (a second
`sentence` column, `"is_impossible": "False"`, a JSON key given twice, ...), and checks that
it is now refused with a message naming the file, the place and the value, or read exactly.
"""
import json

import pytest

from facts import raises
from minibert.data.task_files import LabelMap, QAExample, Sentence, read_conll, read_squad, \
    read_table


def write(path, content):
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


# ---------------------------------------------------------------- tables

@pytest.mark.parametrize("name,content,column,where", [
    # two `sentence` columns: the first used to be read, whichever the file meant
    ("train.tsv", "sentence\tlabel\tsentence\nold text\tpos\tnew text\n", "sentence",
     "columns 1 and 3"),
    ("train.csv", "label,sentence,id,label\npos,great,1,neg\n", "label", "columns 1 and 4"),
    # names are compared after stripping, as they are looked up
    ("train.tsv", "sentence\t sentence \tlabel\tsentence\na\tb\tpos\tc\n", "sentence",
     "columns 1, 2 and 4"),
], ids=["tsv", "csv", "stripped"])
def test_a_requested_column_named_twice_is_refused(tmp_path, name, content, column, where):
    path = write(tmp_path / name, content)
    with raises(ValueError, str(path), repr(column), where, "rename"):
        read_table(path, ["sentence", "label"])


def test_a_duplicate_among_unrequested_columns_is_read(tmp_path):
    path = write(tmp_path / "train.tsv", "id\tsentence\tid\tlabel\tx\tx\n"
                                         "1\tgreat\t2\t0\t\t\n7\tawful\t8\tneg\ta\tb\n")
    assert read_table(path, ["label", "sentence"]) == [(2, ["0", "great"]),
                                                       (3, ["neg", "awful"])]


def test_every_missing_column_is_named(tmp_path):
    path = write(tmp_path / "train.tsv", "text\tgold\nfine\tpos\n")
    with raises(ValueError, str(path), "'sentence', 'label'", "'text', 'gold'"):  # and found
        read_table(path, ["sentence", "label"])


@pytest.mark.parametrize("name", ["train.tsv", "train.csv"])
def test_a_line_of_spaces_is_blank_like_an_empty_line(tmp_path, name):
    """An editor's trailing spaces on an empty line were a row of one field, refused as
    "1 field(s) but the header has 2 (a tab inside a text?)"."""
    sep = "\t" if name.endswith(".tsv") else ","
    path = write(tmp_path / name, f"text{sep}label\nthe cat{sep}pos\n   \n \na dog{sep}neg\n")
    assert read_table(path, ["text", "label"]) == [(2, ["the cat", "pos"]),
                                                   (5, ["a dog", "neg"])]


def test_a_blank_first_line_is_not_taken_for_an_empty_header(tmp_path):
    path = write(tmp_path / "train.csv", "\nsentence,label\ngreat,pos\n")
    with raises(ValueError, str(path), "line 1", "blank", "header"):
        read_table(path, ["sentence", "label"])


@pytest.mark.parametrize("name", ["train.tsv", "train.csv"])
def test_a_text_of_a_megabyte_is_read_like_any_other(tmp_path, name):
    """The csv module refuses a field over 128 KiB; a text is only truncated, later, to the
    sequence length, so it is read whole, and csv's process-wide limit stays as it was."""
    import csv

    long = " ".join(["word"] * 200_000) + ' a "quoted" word, and a comma'
    rows = [(long, "pos"), ("short text", "neg"), (long[:5000].strip(), "pos")]
    sep = "\t" if name.endswith(".tsv") else ","
    quote = (lambda t: t) if sep == "\t" else (lambda t: '"' + t.replace('"', '""') + '"')
    path = write(tmp_path / name, f"sentence{sep}label\n" + "".join(
        f"{quote(t)}{sep}{y}\n" for t, y in rows))
    limit = csv.field_size_limit()
    assert read_table(path, ["sentence", "label"]) == [(i + 2, [t, y])
                                                       for i, (t, y) in enumerate(rows)]
    assert csv.field_size_limit() == limit


def test_integer_labels_are_plain_digits(tmp_path):
    # int() also reads "1_0" as 10 and "٣" as 3: those labels would have merged with others.
    labels = LabelMap.from_labels(["10", "1_0", "2"], tmp_path / "train.tsv")
    assert labels.names == ["10", "1_0", "2"] and not labels.integers
    arabic = LabelMap.from_labels(["3", "\u0663", "+3", "-03"], tmp_path / "train.tsv")
    assert arabic.names == ["+3", "-03", "3", "\u0663"] and not arabic.integers
    numbers = LabelMap.from_labels(["3", "+3", "-03", "10"], tmp_path / "train.tsv")
    assert numbers.names == ["-3", "3", "10"] and numbers.integers


# ---------------------------------------------------------------- CoNLL

def test_conll_lines_are_counted_at_newlines_only(tmp_path):
    # str.splitlines also breaks at U+2028, U+0085, \f, ...: the line numbers drifted and a
    # word holding one was cut in two.
    path = write(tmp_path / "train.txt", "EU\tB-ORG\nNew\u2028York\tB-LOC\nrejects\n")
    with raises(ValueError, str(path), "line 3", "'rejects'"):
        read_conll(path)
    ok = write(tmp_path / "ok.txt", "EU B-ORG\r\ncaf\x85e\tO\r\n\r\nPeter B-PER\r\n")
    assert read_conll(ok) == [Sentence(["EU", "caf\x85e"], ["B-ORG", "O"], 1),
                              Sentence(["Peter"], ["B-PER"], 4)]


@pytest.mark.parametrize("name,content,line", [
    ("train.tsv", "text\tlabel\ngood film\t1\nbad film\t0\rok\t1\n", 3),
    ("train.txt", "EU B-ORG\rrejects O\n", 1),
])
def test_a_carriage_return_alone_is_refused_with_its_line(tmp_path, name, content, line):
    """Only \n (or \r\n) ends a line. csv read a lone \r as a row end (one line became two
    examples) and CoNLL as a column separator (a word and its label were dropped)."""
    path = write(tmp_path / name, content)
    reader = read_conll if name.endswith(".txt") else \
        (lambda p: read_table(p, ["text", "label"]))
    with raises(ValueError, str(path), f"line {line}", "(\\r)", "\\n"):
        reader(path)


def test_conll_columns_split_at_ascii_whitespace_only(tmp_path):
    # str.split() splits at a no-break space too: "New\u00a0York B-LOC" read as the word
    # "New", with "York" dropped as a middle column.
    path = write(tmp_path / "train.txt", "New\u00a0York B-LOC\nsaid\u3000so O\n")
    assert read_conll(path) == [Sentence(["New\u00a0York", "said\u3000so"], ["B-LOC", "O"], 1)]


# ---------------------------------------------------------------- SQuAD

CONTEXT = "The cat sat on the mat in New York City."


def squad_file(tmp_path, *qas, name="train.json"):
    doc = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": CONTEXT, "qas": list(qas)}]}]}
    return write(tmp_path / name, json.dumps(doc))


def qa(qid="q1", answer=("cat", 4), **fields):
    return {"id": qid, "question": "What sat?",
            "answers": [{"text": answer[0], "answer_start": answer[1]}], **fields}


def test_is_impossible_strings_are_parsed_not_truth_tested(tmp_path):
    path = squad_file(tmp_path, qa("a", is_impossible="false"), qa("b", is_impossible="False"),
                      qa("c", is_impossible=False), qa("d"),
                      qa("e", is_impossible="TRUE", answers=[]),
                      qa("f", is_impossible=True, answers=[]),
                      {"id": "g", "question": "What sat?", "is_impossible": "true"})
    got = read_squad(path, version_2=True)
    assert [(x.id, x.answers, x.is_impossible) for x in got] == [
        ("a", [("cat", 4)], False), ("b", [("cat", 4)], False), ("c", [("cat", 4)], False),
        ("d", [("cat", 4)], False), ("e", [], True), ("f", [], True), ("g", [], True)]
    assert all(type(x.is_impossible) is bool for x in got)
    # answerable in a SQuAD 1.1 read too: "false" is not a 2.0 mark
    assert read_squad(squad_file(tmp_path, qa("a", is_impossible="false"))) == [
        QAExample("a", "What sat?", CONTEXT, [("cat", 4)], False)]


@pytest.mark.parametrize("value,shown", [
    ("maybe", '"maybe"'), (1, "1"), (0, "0"), (None, "null"), ("", '""'), (" false", '" false"'),
    ("yes", '"yes"'), ([], "[]"), ("0", '"0"')])
@pytest.mark.parametrize("version_2", [True, False])
def test_is_impossible_other_values_are_refused_showing_the_value(tmp_path, value, shown,
                                                                  version_2):
    path = squad_file(tmp_path, qa("q5"), qa("q6", is_impossible=value))
    # the question, the value as the file holds it, and the values that are read
    with raises(ValueError, str(path), "'q6'", f"is_impossible {shown}", "true", "false"):
        read_squad(path, version_2=version_2)


@pytest.mark.parametrize("value,shown", [(True, "true"), ("True", '"True"'),
                                         ("TRUE", '"TRUE"')])
def test_a_v1_read_of_a_2_0_mark_states_the_value(tmp_path, value, shown):
    path = squad_file(tmp_path, qa("q2", is_impossible=value, answers=[]))
    with raises(ValueError, str(path), "'q2'", "is_impossible", shown, "version_2=True"):
        read_squad(path)


def test_an_impossible_question_with_answers_is_refused(tmp_path):
    # What a string flag used to do: every answer of a question thrown away, silently.
    path = squad_file(tmp_path, qa("q3", is_impossible=True))
    with raises(ValueError, str(path), "'q3'", "is_impossible", "1 answer", "[]",
                "plausible_answers"):
        read_squad(path, version_2=True)


@pytest.mark.parametrize("answer_start", [True, False, 4.0, "4"])
def test_answer_start_is_an_integer_not_a_boolean(tmp_path, answer_start):
    # True is an int to isinstance: "he" at True (1) matched "The cat" and was read.
    path = squad_file(tmp_path, qa(answer=("he", answer_start)))
    with raises(ValueError, str(path), "'q1'", "'answer_start'", repr(answer_start)):
        read_squad(path)


def test_an_id_is_text_or_an_integer_not_a_boolean(tmp_path):
    path = squad_file(tmp_path, qa(qid=True))
    with raises(ValueError, str(path), "data[0].paragraphs[0].qas[0]", "'id'", "True"):
        read_squad(path)
    ids = read_squad(squad_file(tmp_path, qa(qid=7), qa(qid="q8")))
    assert [x.id for x in ids] == ["7", "q8"]


def test_a_null_field_is_not_called_missing(tmp_path):
    path = squad_file(tmp_path, {"id": "q4", "question": None, "answers": []})
    with raises(ValueError, str(path), "'q4'", "'question'", "None"):
        read_squad(path)


def test_an_empty_question_is_refused(tmp_path):
    path = squad_file(tmp_path, qa(question=" \t"))
    with raises(ValueError, str(path), "'q1'", "empty question"):
        read_squad(path)


@pytest.mark.parametrize("text,where,key", [
    # json keeps the last of two keys: this file was read as answerable (false), silently
    ('{"data": [{"paragraphs": [{"context": "The cat sat.", "qas": [{"id": "q1", '
     '"question": "What sat?", "is_impossible": true, "is_impossible": false, '
     '"answers": [{"text": "cat", "answer_start": 4}]}]}]}]}',
     "question 'q1'", "is_impossible"),
    ('{"data": [{"paragraphs": [{"context": "A dog.", "context": "The cat sat.", "qas": ['
     '{"id": "q1", "question": "What sat?", "answers": [{"text": "cat", '
     '"answer_start": 4}]}]}]}]}',
     "data[0].paragraphs[0]", "context"),
    ('{"data": [{"paragraphs": [{"context": "The cat sat.", "qas": [{"id": "q1", '
     '"question": "What sat?", "answers": [{"text": "cat", "answer_start": 9, '
     '"answer_start": 4}]}]}]}]}',
     "question 'q1''s answer", "answer_start"),
    ('{"data": [], "data": [{"paragraphs": []}]}', "the top level", "data"),
], ids=["is_impossible", "context", "answer_start", "data"])
def test_a_json_key_given_twice_is_refused_where_it_is_read(tmp_path, text, where, key):
    path = write(tmp_path / "dev.json", text)
    with raises(ValueError, str(path), where, repr(key), "twice"):
        read_squad(path, version_2=True)


def test_a_json_key_given_twice_that_is_not_read_is_fine(tmp_path):
    path = write(tmp_path / "dev.json",
                 '{"version": "1", "version": "2", "data": [{"title": "a", "title": "b", '
                 '"paragraphs": [{"context": "The cat sat.", "qas": [{"id": "q1", '
                 '"question": "What sat?", "answers": [{"text": "cat", "answer_start": 4}], '
                 '"plausible_answers": [], "plausible_answers": []}]}]}]}')
    assert read_squad(path) == [QAExample("q1", "What sat?", "The cat sat.", [("cat", 4)],
                                          False)]


def test_scores_are_not_taken_for_class_names(tmp_path):
    """STS-B's similarity scores (0.0 - 5.0) were trained as one class per distinct value,
    and a dev score not seen in training was refused as an unknown label."""
    path = write(tmp_path / "train.tsv", "text\tlabel\na\t0.0\nb\t2.5\nc\t5.0\n")
    with raises(ValueError, str(path), "2.5", "regression"):
        LabelMap.from_labels(["0.0", "2.5", "5.0"], path)
    # Whole numbers written as decimals (a float column exported by pandas) stay classes.
    assert LabelMap.from_labels(["0.0", "1.0", "1.0"], path).names == ["0.0", "1.0"]
