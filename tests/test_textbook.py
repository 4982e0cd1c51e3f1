"""The textbook's promises, kept by the tree itself: the five files a student reads to learn
the model speak of the algorithm (the machine's matters live in kernels.py, memory.py,
environment.py, autotune.py and docs/machine-room.md), the loop names each thing a step
does, and the main job reads top to bottom."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "minibert"
TEXTBOOK = [f"model/{name}" for name in ("config.py", "model.py", "attention.py", "rope.py",
                                          "heads.py")]
# What a reader of the model should not have to wade through.
MACHINE_ROOM_WORDS = re.compile(r"onednn|allocator|page[- ]fault|mallopt|glibc", re.I)


@pytest.mark.parametrize("name", TEXTBOOK)
def test_a_textbook_file_speaks_of_the_algorithm_not_the_machine(name):
    text = (PACKAGE / name).read_text()
    assert not MACHINE_ROOM_WORDS.findall(text), MACHINE_ROOM_WORDS.findall(text)
    assert text.count("RESULTS.md") <= 1


def test_the_checks_see_what_they_look_for():
    assert MACHINE_ROOM_WORDS.search("oneDNN's kernel cache")
    assert MACHINE_ROOM_WORDS.search("glibc's malloc returns it")


def test_the_main_job_reads_top_to_bottom():
    """examples/pretrain_wikitext.py's `main` is one `with cli.Script(...)` block that goes
    flags -> data -> model -> --out -> train -> outputs in that order, and hands no function
    of its own to the library to call (no inverted control)."""
    script = PACKAGE.parent / "examples" / "pretrain_wikitext.py"
    tree = ast.parse(script.read_text())
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    block = next(n for n in main.body if isinstance(n, ast.With))
    assert ast.unparse(block.items[0].context_expr).startswith("cli.Script(")
    calls = [ast.unparse(n.func) for n in sorted(
        (n for n in ast.walk(block) if isinstance(n, ast.Call)),
        key=lambda n: (n.lineno, n.col_offset))]
    order = ["script.start", "pretrain.check_args", "pretrain.read_corpus",
             "pretrain.prepare_data", "build_model", "script.claim", "train",
             "model.save_pretrained", "pretrain.write_json"]
    assert [calls.index(c) for c in order] == sorted(calls.index(c) for c in order), calls
    own = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    handed = [ast.unparse(a) for n in ast.walk(main) if isinstance(n, ast.Call)
              for a in n.args if isinstance(a, ast.Name) and a.id in own]
    assert not handed, handed
