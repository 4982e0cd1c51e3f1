"""minibert.data.tasks: task readers and their errors, encoders for classification, token
labels and QA (checked against transformers' BertTokenizerFast on the same vocab.txt), the
QA span search across windows, and the collator."""
import json

import numpy as np
import pytest
import torch

import minibert

from facts import raises
from minibert.data import IGNORE_INDEX
from minibert.data.tasks import (
    LabelMap,
    QAExample,
    Sentence,
    TaskCollator,
    best_span,
    encode_classification,
    encode_qa,
    encode_token_classification,
    read_conll,
    read_squad,
    read_table,
    word_predictions,
)
from minibert.data.tokenizer import SPECIAL_TOKENS, Tokenizer

# A hand-made vocabulary, so that the pieces of each word are known: "unbelievable" is
# un ##believ ##able, "cats" cat ##s, and any other lowercase word is spelled in letters.
LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789"
WORDS = ["the", "cat", "sat", "on", "mat", "un", "##believ", "##able", "new", "york", "city",
         "went", "to", "where", "did", "go", "in", "end", "a", "dog"]
VOCAB = list(SPECIAL_TOKENS) + WORDS + [t for c in LETTERS for t in (c, f"##{c}")
                                        if t not in WORDS] + list(".,?!'-")


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("vocab")
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def tok(vocab_dir):
    return Tokenizer.from_pretrained(vocab_dir)


@pytest.fixture(scope="module")
def ref(vocab_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.BertTokenizerFast.from_pretrained(str(vocab_dir))


def write(path, content):
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


# ---------------------------------------------------------------- tables and labels

BAD_TABLES = [
    # (file name, content, the facts its message must hold: the file, the line, the field or
    # value at fault): examples/finetune_classification.py says the same, see
    # test_finetune.BAD_FILES.
    pytest.param("train.tsv", b"", ["train.tsv", "empty"], id="empty"),
    pytest.param("train.tsv", b"sentence\tlabel\n\n", ["train.tsv", "no data rows"],
                 id="header only"),
    pytest.param("train.tsv", b"text\tlabel\nthe great film\tpos\n",
                 ["train.tsv", "'sentence'", "'text', 'label'"], id="no column"),
    pytest.param("train.tsv", b"sentence\tlabel\ngreat\tpos\nawful\tneg\tmore\n",
                 ["train.tsv", "line 3", "3 field(s)", "2"], id="extra field"),
    pytest.param("train.tsv", b"sentence\tlabel\ngreat\tpos\n \tneg\n",
                 ["train.tsv", "line 3", "'sentence'", "empty"], id="empty text"),
    pytest.param("train.tsv", b"sentence\tlabel\ngreat\tpos\nawful\t\n",
                 ["train.tsv", "line 3", "'label'", "empty"], id="empty label"),
    pytest.param("train.tsv", b"sentence\tlabel\ngreat\tpos\nawf\xffl\tneg\n",
                 ["train.tsv", "line 3", "UTF-8", "0xff"], id="not UTF-8"),
    pytest.param("train.csv", b'sentence,label\ngreat,pos\n"awful" film,neg\n',
                 ["train.csv", "line 3", "unreadable"], id="bad quoting"),
    pytest.param("train.csv", b"sentence,label\ngreat,pos\nawful, boring,neg\n",
                 ["train.csv", "line 3", "3 field(s)", "quote"], id="unquoted comma"),
    pytest.param("train.txt", b"sentence\tlabel\ngreat\tpos\n",
                 ["train.txt", "'.txt'", ".tsv", ".csv"], id="unknown extension"),
]


@pytest.mark.parametrize("name,content,facts", BAD_TABLES)
def test_read_table_errors_name_file_and_line(tmp_path, name, content, facts):
    with raises(ValueError, *facts):
        read_table(write(tmp_path / name, content), ["sentence", "label"])


def test_read_table_reads_tsv_and_csv(tmp_path):
    tsv = write(tmp_path / "a.tsv", '\ufeffid\tsentence\tlabel\n1\tsay "hi", twice\tpos\n\n'
                                    '2\t  spaced  \tneg\n')
    assert read_table(tsv, ["sentence", "label"]) == [(2, ['say "hi", twice', "pos"]),
                                                      (4, ["spaced", "neg"])]
    csv_ = write(tmp_path / "a.csv", 'sentence,label\n"two\nlines, one field",pos\nnext,neg\n')
    assert read_table(csv_, ["label", "sentence"]) == [(2, ["pos", "two\nlines, one field"]),
                                                       (4, ["neg", "next"])]
    with raises(FileNotFoundError, str(tmp_path / "nowhere.tsv")):
        read_table(tmp_path / "nowhere.tsv", ["sentence"])


def test_label_map_names_classes_and_refuses_unknown_labels(tmp_path):
    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    with raises(ValueError, str(train), "'pos'", "two classes"):
        LabelMap.from_labels(["pos", "pos"], train)
    labels = LabelMap.from_labels(["pos", "neu", "neg", "pos"], train)
    assert labels.names == ["neg", "neu", "pos"] and labels.id("pos", dev, 2) == 2
    # the file and line, the label, and the file whose labels it is not among
    with raises(ValueError, str(dev), "line 4", "'mixed'", str(train), "'neg', 'neu', 'pos'"):
        labels.id("mixed", dev, 4)
    numbers = LabelMap.from_labels(["10", "2", "07", "7"], train)  # by value; 07 is 7
    assert numbers.names == ["2", "7", "10"] and numbers.id("007", dev, 9) == 1


# ---------------------------------------------------------------- CoNLL

def test_read_conll(tmp_path):
    path = write(tmp_path / "train.txt",
                 "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n\n"
                 "Peter\tB-PER\nNew York\tB-LOC\n-DOCSTART- O\nlast O")  # no final newline
    assert read_conll(path) == [Sentence(["EU", "rejects"], ["B-ORG", "O"], 3),
                                Sentence(["Peter", "New York"], ["B-PER", "B-LOC"], 7),
                                Sentence(["last"], ["O"], 10)]


@pytest.mark.parametrize("content,facts", [
    ("EU B-ORG\nrejects\n", ["line 2", "one column", "'rejects'"]),
    ("EU\tB-ORG\nrejects\t\n", ["line 2", "label", "empty"]),
    ("", ["empty"]),
    ("-DOCSTART- O\n\n", ["no sentences", "-DOCSTART-"]),
    (b"EU B-ORG\n\xe9t\xe9 O\n", ["line 2", "UTF-8", "0xe9"]),
])
def test_read_conll_errors(tmp_path, content, facts):
    with raises(ValueError, str(tmp_path / "train.txt"), *facts):
        read_conll(write(tmp_path / "train.txt", content))
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        read_conll(tmp_path / "nope.txt")


# ---------------------------------------------------------------- SQuAD

def squad(*qas, context="The cat sat on the mat in New York City."):
    return {"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": list(qas)}]}]}


def test_read_squad_v1_and_v2(tmp_path):
    v1 = write(tmp_path / "v1.json", json.dumps(squad(
        {"id": "q1", "question": "Where?", "answers": [
            {"text": "New York City", "answer_start": 26},
            {"text": "New York", "answer_start": 26}]})))
    assert read_squad(v1) == [QAExample("q1", "Where?", "The cat sat on the mat in New York City.",
                                        [("New York City", 26), ("New York", 26)], False)]
    v2 = write(tmp_path / "v2.json", json.dumps(squad(
        {"id": "q1", "question": "Who?", "answers": [], "is_impossible": True,
         "plausible_answers": [{"text": "cat", "answer_start": 4}]},
        {"id": "q2", "question": "What sat?", "answers": [{"text": "cat", "answer_start": 4}],
         "is_impossible": False})))
    got = read_squad(v2, version_2=True)
    assert [(x.id, x.answers, x.is_impossible) for x in got] == \
        [("q1", [], True), ("q2", [("cat", 4)], False)]
    with raises(ValueError, str(v2), "'q1'", "is_impossible", "version_2=True"):
        read_squad(v2)


@pytest.mark.parametrize("content,facts", [
    ("", ["empty"]),
    ('{"data": [\n  {"paragraphs": [}\n]}', ["line 2", "JSON"]),
    ('{"version": "1.1"}', ["'data'"]),
    (json.dumps(squad({"id": "q7", "question": "Where?",
                       "answers": [{"text": "New York", "answer_start": 25}]})),
     ["'q7'", "'New York'", "answer_start 25", "' New Yor'"]),  # the answer, and what is there
    (json.dumps(squad({"id": "q8", "question": "Where?", "answers": []})),
     ["'q8'", "no answers"]),
    (json.dumps(squad({"id": "q9", "answers": []})), ["'q9'", "'question'"]),
    (json.dumps(squad(*[{"id": "q1", "question": "Where?", "answers": [
        {"text": "cat", "answer_start": 4}]}] * 2)), ["'q1'", "twice"]),
    (json.dumps({"data": []}), ["no questions"]),
])
def test_read_squad_errors(tmp_path, content, facts):
    with raises(ValueError, str(tmp_path / "bad.json"), *facts):
        read_squad(write(tmp_path / "bad.json", content))



# ---------------------------------------------------------------- sequence classification

def test_classification_truncates_longest_first_like_transformers(tok, ref):
    texts = ["a b c d e f g h", "a b", "the cat sat", "unbelievable cats", "dog"]
    pairs = ["a b c", "a b c d e f g h", "on the mat", "the dog sat on the mat", "cat"]
    short = encode_classification(tok, texts[:2], [0, 1], pairs[:2], max_len=9)
    # the example script's rule (test_finetune.test_longest_first_truncation)
    assert short[0]["token_type_ids"].tolist() == [0] * 5 + [1] * 4
    assert short[1]["token_type_ids"].tolist() == [0] * 4 + [1] * 5
    assert [f["label"] for f in short] == [0, 1]
    for max_len in range(4, 16):
        for f, a, b in zip(encode_classification(tok, texts, pairs=pairs, max_len=max_len),
                           texts, pairs):
            want = ref(a, b, truncation="longest_first", max_length=max_len)
            assert f["input_ids"].tolist() == want["input_ids"], (a, b, max_len)
            assert f["token_type_ids"].tolist() == want["token_type_ids"]
            assert "label" not in f
        for f, a in zip(encode_classification(tok, texts, max_len=max_len), texts):
            assert f["input_ids"].tolist() == ref(a, truncation=True, max_length=max_len)[
                "input_ids"]
    with raises(ValueError, "2 texts", "1 labels"):
        encode_classification(tok, texts[:2], [0])


# ---------------------------------------------------------------- token classification

SENTENCE = ["The", "unbelievable", "cats", "sat", "on", "a", "mat", "in", "New", "York", "."]
TAGS = [0, 0, 1, 0, 0, 0, 1, 0, 2, 3, 0]


def test_word_labels_sit_on_first_pieces(tok, ref):
    (f,) = encode_token_classification(tok, [SENTENCE], [TAGS], max_len=64)
    want = ref(SENTENCE, is_split_into_words=True)
    assert f["input_ids"].tolist() == want["input_ids"]
    assert f["word_ids"].tolist() == [-1 if w is None else w for w in want.word_ids()]
    pieces = [tok.id_to_token(i) for i in f["input_ids"]]
    assert pieces[2:5] == ["un", "##believ", "##able"] and pieces[5:7] == ["cat", "##s"]
    expected = [IGNORE_INDEX] + [0, 0, IGNORE_INDEX, IGNORE_INDEX, 1, IGNORE_INDEX] + \
        TAGS[3:] + [IGNORE_INDEX]
    assert f["labels"].tolist() == expected
    assert word_predictions([f], [f["labels"]]) == [TAGS]  # read back from first pieces


def test_long_sentences_become_windows_covering_every_word_once(tok, ref):
    words = (SENTENCE * 4)[:40] + ["x" * 30]  # the last word has more pieces than a window
    labels = [i % 5 for i in range(len(words))]
    want = ref(words, is_split_into_words=True)
    pieces = [[i for i, w in zip(want["input_ids"], want.word_ids()) if w == k]
              for k in range(len(words))]
    for max_len in (3, 4, 7, 12, 30):
        features = encode_token_classification(tok, [SENTENCE, words], [TAGS, labels],
                                               max_len=max_len)
        mine = [f for f in features if f["sentence"] == 1]
        assert len(mine) > 1 and all(len(f["input_ids"]) <= max_len for f in features)
        covered = [w for f in mine for w in dict.fromkeys(f["word_ids"].tolist()) if w >= 0]
        assert covered == list(range(len(words)))  # each word in one window, in order
        # Windows are whole words: joined, they are the sentence's pieces, except that a
        # word with more pieces than a window holds keeps its first ones.
        joined = [i for f in mine for i in f["input_ids"][1:-1].tolist()]
        assert joined == [i for p in pieces for i in p[:max_len - 2]]
        assert all(f["input_ids"][0] == tok.cls_id and f["input_ids"][-1] == tok.sep_id
                   for f in mine)
        # Each word predicted exactly once, whatever the features' order.
        assert word_predictions(features[::-1], [f["labels"] for f in features[::-1]]) == \
            [TAGS, labels]
    with raises(ValueError, "sentence 1", "missing"):
        word_predictions(features[:-1], [f["labels"] for f in features[:-1]])


def test_a_word_with_no_pieces_still_gets_a_prediction(tok):
    words = ["the", "\u200b", "cat"]  # a zero-width space normalizes to nothing
    (f,) = encode_token_classification(tok, [words], [[0, 1, 2]])
    assert f["input_ids"].tolist()[1:-1] == [tok.token_to_id("the"), tok.unk_id,
                                             tok.token_to_id("cat")]
    assert word_predictions([f], [f["labels"]]) == [[0, 1, 2]]
    with raises(ValueError, "sentence 0", "3 words", "2 labels"):
        encode_token_classification(tok, [words], [[0, 1]])


# ---------------------------------------------------------------- extractive QA

FILLER = "the cat sat on the mat . "
CONTEXT = FILLER * 3 + "the cat went to New York City in the end . " + FILLER * 4
ANSWER = ("New York City", CONTEXT.index("New York City"))
QUESTION = "where did the cat go ?"


def test_qa_windows_match_transformers_overflow(tok, ref):
    ex = QAExample("q", QUESTION, CONTEXT, [ANSWER], False)
    for max_len, stride in ((36, 10), (20, 0), (30, 15), (128, 32)):
        features = encode_qa(tok, [ex], max_len=max_len, doc_stride=stride)
        want = ref(QUESTION, CONTEXT, truncation="only_second", max_length=max_len,
                   stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True)
        assert [f["input_ids"].tolist() for f in features] == want["input_ids"]
        assert [f["token_type_ids"].tolist() for f in features] == want["token_type_ids"]
        for w, f in enumerate(features):
            context = np.array([s == 1 for s in want.sequence_ids(w)])
            assert f["is_context"].tolist() == context.tolist()
            assert f["offsets"][context].tolist() == \
                [list(o) for o, c in zip(want["offset_mapping"][w], context) if c]
        # every context token has exactly one max-context window
        starts = [int(f["offsets"][f["max_context"]][:, 0].min()) for f in features]
        n_context = sum(int(f["max_context"].sum()) for f in features)
        assert n_context == len(ref(CONTEXT, add_special_tokens=False)["input_ids"])
        assert starts == sorted(starts)


def test_answer_across_a_window_edge_is_found_in_the_window_that_holds_it(tok):
    ex = QAExample("q", QUESTION, CONTEXT, [ANSWER], False)
    features = encode_qa(tok, [ex], max_len=36, doc_stride=10)
    assert len(features) >= 3
    answer_chars = {ANSWER[1] + i for i, ch in enumerate(ANSWER[0]) if ch != " "}

    def chars(f):  # the context characters a window holds
        return {c for s, e in f["offsets"][f["is_context"]] for c in range(s, e)}

    first, second = features[0], features[1]
    cut = answer_chars & chars(first)
    assert cut and cut != answer_chars  # window 0 holds "New York" but not "City"
    assert answer_chars <= chars(second)
    assert (first["start_position"], first["end_position"]) == (0, 0)
    s, e = second["start_position"], second["end_position"]
    assert CONTEXT[second["offsets"][s][0]:second["offsets"][e][1]] == "New York City"
    assert all((f["start_position"], f["end_position"]) == (0, 0) for f in features[2:])

    # Logits that favour the cut span "New York" in window 0 more than the full answer in
    # window 1: the start token has more context in window 1, so window 0 cannot start
    # the answer there, and best_span returns the full answer's exact characters.
    start_logits = [np.full(len(f["input_ids"]), -5.0) for f in features]
    end_logits = [np.full(len(f["input_ids"]), -5.0) for f in features]
    york = int(np.nonzero(first["is_context"])[0][-1])  # window 0's last context token
    start_logits[0][york - 1], end_logits[0][york] = 9.0, 9.0
    start_logits[1][s], end_logits[1][e] = 4.0, 4.0
    (pred,) = best_span(start_logits, end_logits, features, [ex], max_answer_length=10)
    assert (pred.text, pred.start, pred.end) == ("New York City", *ANSWER[1:],
                                                 ANSWER[1] + len(ANSWER[0]))
    assert pred.score == 8.0
    # Spans longer than max_answer_length tokens are not candidates.
    (short,) = best_span(start_logits, end_logits, features, [ex], max_answer_length=2)
    assert short.text != "New York City"


@pytest.mark.parametrize("answer", ["e\u0301te\u0301", "\u0939\u0902"],
                         ids=["decomposed-accent", "anusvara"])
def test_a_predicted_span_keeps_the_accents_that_follow_its_last_letter(tok, answer):
    """Written decomposed (NFD), an accent is a character of its own after its letter; the
    tokenizer strips it (any nonspacing mark, of combining class 0 or not), so its token's
    offsets end before it, and the predicted text lost its last mark and the exact match."""
    context = f"the cat {answer} sat on the mat"
    ex = QAExample("q", "where did the cat go", context, [(answer, context.index(answer))],
                   False)
    (f,) = encode_qa(tok, [ex])
    start, end = np.full(len(f["input_ids"]), -9.0), np.full(len(f["input_ids"]), -9.0)
    start[f["start_position"]], end[f["end_position"]] = 9.0, 9.0
    (pred,) = best_span([start], [end], [f], [ex])
    assert (pred.text, pred.start, pred.end) == (answer, 8, 8 + len(answer))


def test_unanswerable_questions_and_the_null_score_rule(tok):
    impossible = QAExample("x", QUESTION, CONTEXT, [], True)
    features = encode_qa(tok, [impossible], max_len=36, doc_stride=10)
    assert all((f["start_position"], f["end_position"]) == (0, 0) for f in features)
    start_logits = [np.zeros(len(f["input_ids"])) for f in features]
    end_logits = [np.zeros(len(f["input_ids"])) for f in features]
    c = int(np.nonzero(features[0]["is_context"] & features[0]["max_context"])[0][0])
    start_logits[0][c] = end_logits[0][c] = 2.0  # a span scoring 4
    for f, s, e in zip(features, start_logits, end_logits):
        s[0], e[0] = 3.0, 2.0  # [CLS] scores 5 in every window ...
    start_logits[1][0] = 1.0  # ... but 3 in one: the null score is the lowest, 3
    (v2,) = best_span(start_logits, end_logits, features, [impossible], version_2=True)
    assert (v2.text, v2.start, v2.null_score_diff) == ("the", 0, -1.0)  # 3 - 4 < 0
    start_logits[1][0] = 3.0  # null score 5: beats the span by 1
    (v2,) = best_span(start_logits, end_logits, features, [impossible], version_2=True)
    assert (v2.text, v2.start, v2.end, v2.score, v2.null_score_diff) == ("", -1, -1, 5.0, 1.0)
    (keep,) = best_span(start_logits, end_logits, features, [impossible], version_2=True,
                        null_score_diff_threshold=1.5)
    assert keep.text == "the"
    (v1,) = best_span(start_logits, end_logits, features, [impossible])  # no null answer
    assert v1.text == "the"
    torch_logits = [torch.tensor(s, dtype=torch.bfloat16) for s in start_logits]
    assert best_span(torch_logits, end_logits, features, [impossible])[0].text == "the"


def test_qa_settings_are_checked(tok):
    ex = QAExample("q", QUESTION, CONTEXT, [ANSWER], False)
    with raises(ValueError, "'q'", "max_len=16", "7 context tokens", "doc_stride=8"):
        encode_qa(tok, [ex], max_len=16, doc_stride=8)
    short_question = encode_qa(tok, [ex], max_len=16, doc_stride=8, max_question_len=2)
    assert short_question[0]["input_ids"][:4].tolist() == [
        tok.cls_id, tok.token_to_id("where"), tok.token_to_id("did"), tok.sep_id]
    zeros = [np.zeros(len(f["input_ids"])) for f in short_question]
    with raises(ValueError, "example 1", "'q2'"):
        best_span(zeros, zeros, short_question, [ex, ex._replace(id="q2")])


# ---------------------------------------------------------------- collator

def test_collator_pads_every_task(tok):
    collate = TaskCollator(tok.pad_id)
    cls = encode_classification(tok, ["the cat", "the cat sat on the mat"], [1, 0],
                                pairs=["a dog", "a"])
    with raises(ValueError, "pad_to_multiple_of=0"):
        TaskCollator(tok.pad_id, pad_to_multiple_of=0)
    batch = collate(cls, epoch=3)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    assert batch["input_ids"].shape == batch["token_type_ids"].shape == (2, 10)
    assert batch["attention_mask"].sum(1).tolist() == [7, 10]
    assert batch["input_ids"][0, 7:].tolist() == [tok.pad_id] * 3
    assert batch["token_type_ids"][0].tolist() == [0] * 4 + [1] * 3 + [0] * 3
    assert batch["labels"].tolist() == [1, 0] and batch["labels"].dtype == torch.long
    regression = collate([{**cls[0], "label": 0.5}, {**cls[1], "label": 1}])["labels"]
    assert regression.dtype == torch.float32 and regression.tolist() == [0.5, 1.0]

    ner = encode_token_classification(tok, [SENTENCE, ["a", "dog"]], [TAGS, [0, 1]])
    batch = TaskCollator(tok.pad_id, pad_to_multiple_of=8)(ner)
    assert batch["labels"].shape == batch["input_ids"].shape == (2, 16)
    assert batch["labels"][1].tolist() == [IGNORE_INDEX, 0, 1] + [IGNORE_INDEX] * 13
    assert batch["attention_mask"][1].tolist() == [1] * 4 + [0] * 12

    qa = encode_qa(tok, [QAExample("q", QUESTION, CONTEXT, [ANSWER], False)], max_len=36,
                   doc_stride=10)
    batch = collate(qa)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "start_positions",
                          "end_positions"}
    assert batch["start_positions"].tolist() == [f["start_position"] for f in qa]
    assert batch["start_positions"].shape == (len(qa),)
    with raises(ValueError, "1 of 2", "'label'"):
        collate([cls[0], {k: v for k, v in cls[1].items() if k != "label"}])


@pytest.mark.parametrize("task", ["sequence", "token", "qa"])
def test_padding_to_a_multiple_changes_no_loss_or_logit(tok, task):
    """Padding up to a multiple adds positions the model must not see: the loss and every
    real position's logits are those of the batch padded to its longest feature."""
    from conftest import tiny_config

    torch.manual_seed(0)
    config = tiny_config(vocab_size=tok.vocab_size, hidden_dropout=0.0, attention_dropout=0.0)
    if task == "sequence":
        model = minibert.BertForSequenceClassification(config, num_labels=3)
        features = encode_classification(tok, ["the cat", "the cat sat on the mat ."], [1, 2])
    elif task == "token":
        model = minibert.BertForTokenClassification(config, num_labels=4)
        features = encode_token_classification(tok, [SENTENCE[:-1], ["a", "dog"]],
                                               [TAGS[:-1], [0, 1]])
    else:
        model = minibert.BertForQuestionAnswering(config)
        features = encode_qa(tok, [QAExample("q", QUESTION, CONTEXT, [ANSWER], False)],
                             max_len=37, doc_stride=10)
    model.eval()
    tight, rounded = (TaskCollator(tok.pad_id, pad_to_multiple_of=m)(features) for m in (None, 8))
    T = tight["input_ids"].shape[1]
    assert T % 8 and rounded["input_ids"].shape[1] == -(-T // 8) * 8  # padding was added
    with torch.no_grad():
        a, b = model(**tight), model(**rounded)
    torch.testing.assert_close(b.loss, a.loss, rtol=1e-6, atol=1e-6)
    logits = ["start_logits", "end_logits"] if task == "qa" else ["logits"]
    for name in logits:
        x, y = getattr(a, name), getattr(b, name)
        if task != "sequence":  # per position: the real ones, the first T
            y = y[:, :T]
        keep = tight["attention_mask"].bool() if task != "sequence" else slice(None)
        torch.testing.assert_close(y[keep], x[keep], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- whole tasks (TaskData)

def test_read_table_task_is_the_files_rows_with_the_training_files_classes(tmp_path, tok):
    from minibert.data.tasks import SequenceSplit, read_table_task

    train = write(tmp_path / "train.tsv", "text\tother\ty\nthe cat\tx\tpos\n\na dog\tx\tneg\n"
                                          "the mat\tx\tpos\nnew york\tx\tmid\n")
    dev = write(tmp_path / "dev.csv", 'text,other,y\n"a cat, sat",z,neg\n')
    task = read_table_task(train, dev, "text", "other", "y")
    assert task.kind == "sequence" and task.names == ["mid", "neg", "pos"]  # sorted
    assert isinstance(task.train, SequenceSplit) and len(task.train) == 4
    # Read by hand: rows in file order, their lines (the blank line 3 is skipped), class ids.
    assert task.train.texts == ["the cat", "a dog", "the mat", "new york"]
    assert task.train.pairs == ["x"] * 4 and task.train.lines == [2, 4, 5, 6]
    assert task.train.labels == [2, 1, 2, 0]
    assert (task.eval.texts, task.eval.pairs, task.eval.labels, task.eval.lines) == \
        (["a cat, sat"], ["z"], [1], [2])
    assert task.train.tokenizer_texts() == task.train.texts + task.train.pairs
    assert [f["input_ids"].tolist() for f in task.train.encode(tok, 8)] == \
        [tok.encode_pair(a, b, 8).input_ids for a, b in zip(task.train.texts, task.train.pairs)]
    single = read_table_task(train, dev, "text", None, "y")
    assert single.train.pairs is None and single.train.tokenizer_texts() == single.train.texts
    # A subset is drawn by the seed, keeps the file's order, and leaves the eval split whole.
    a = read_table_task(train, dev, "text", None, "y", max_train=2, seed=3)
    assert a == read_table_task(train, dev, "text", None, "y", max_train=2, seed=3)
    assert len(a.train) == 2 and a.train.lines == sorted(a.train.lines)
    assert set(a.train.lines) <= {2, 4, 5, 6} and a.eval == single.eval
    bad = write(tmp_path / "bad.tsv", "text\tother\ty\nthe cat\tx\tnew\n")
    with raises(ValueError, str(bad), "line 2", "'new'", str(train)):
        read_table_task(train, bad, "text", None, "y")


def test_read_conll_task_checks_every_tag_against_the_scheme(tmp_path, tok):
    from minibert.data.tasks import TokenSplit, read_conll_task

    train = write(tmp_path / "train.conll", "the O\ncat B-X\n\nnew B-Y\nyork I-Y\n")
    dev = write(tmp_path / "dev.conll", "a O\ndog B-X\n")
    task = read_conll_task(train, dev, "IOB2")
    assert task.kind == "token" and task.names == ["B-X", "B-Y", "I-Y", "O"]
    assert isinstance(task.train, TokenSplit) and len(task.train) == 2
    assert [s.words for s in task.train.sentences] == [["the", "cat"], ["new", "york"]]
    assert task.train.labels == [[3, 0], [1, 2]] and task.eval.labels == [[3, 0]]
    assert task.train.tokenizer_texts() == ["the cat", "new york"]
    assert [f["labels"].tolist() for f in task.train.encode(tok, 16)] == \
        [f["labels"].tolist() for f in encode_token_classification(
            tok, [["the", "cat"], ["new", "york"]], [[3, 0], [1, 2]], 16)]
    # A tag the scheme lacks is named with its file and line, in either file.
    with raises(ValueError, str(train), "line 2", "'B-X'", "'IO'"):
        read_conll_task(train, dev, "IO")
    odd = write(tmp_path / "odd.conll", "a O\n\ndog X\n")
    with raises(ValueError, str(odd), "line 3", "'X'"):

        read_conll_task(train, odd, "IOB2")
    sub = read_conll_task(train, dev, "IOB2", max_train=1, seed=0)
    assert len(sub.train) == 1 and sub.train.sentences[0] in task.train.sentences


def test_random_subset_keeps_order_and_is_fixed_by_the_seed():
    from minibert.data.tasks import random_subset

    items = list(range(100))
    a = random_subset(items, 10, seed=1)
    assert a == sorted(a) and len(set(a)) == 10 and a == random_subset(items, 10, seed=1)
    assert a != random_subset(items, 10, seed=2)
    assert random_subset(items, None, 0) is items and random_subset(items, 200, 0) is items
