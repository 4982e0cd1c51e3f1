"""The refusal-test helper fails when it should: a fact missing, another exception, none."""

import pytest

from facts import assert_carries, raises, without


def test_raises_passes_with_every_fact_and_gives_the_exception():
    with raises(ValueError, "--seq-len 600", "max_position_embeddings=512") as info:
        raise ValueError("--seq-len 600 exceeds max_position_embeddings=512")
    assert isinstance(info.value, ValueError)


def test_raises_fails_when_a_fact_is_missing_and_names_it():
    with pytest.raises(AssertionError, match="512"):
        with raises(ValueError, "--seq-len 600", "512"):
            raise ValueError("--seq-len 600 is too long")


def test_a_fact_is_a_literal_not_a_pattern():
    with pytest.raises(AssertionError):
        with raises(ValueError, "shape (2, 5)"):
            raise ValueError("shape 2, 5")  # "(2, 5)" as a regex would match "2, 5"


def test_raises_lets_another_exception_through_and_fails_without_one():
    with pytest.raises(KeyError):
        with raises(ValueError, "x"):
            raise KeyError("x")
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        with raises(ValueError, "x"):
            pass


def test_assert_carries_and_without():
    assert_carries("error: --lr 0.5 is too high", "--lr", "0.5")
    with pytest.raises(AssertionError):
        assert_carries("error: --lr 0.5 is too high", "--lr 0.05")
    with pytest.raises(TypeError):
        assert_carries("anything", "")  # an empty fact would be in every message
    # a number is checked with the temporary folder taken out
    text = "/tmp/pytest-16/run holds a checkpoint of batch size 8"
    assert "16" in text and "16" not in without(text, "/tmp/pytest-16/run")
