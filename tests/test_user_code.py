"""Bounding the wall-clock time of user code (cgrpo.support.user_code)."""

import threading
import time

import pytest

from cgrpo.support.user_code import call_with_timeout, normalise_answer


def test_returns_the_value_and_raises_the_error():
    assert call_with_timeout(lambda: 3, 1.0, "verifier") == 3
    assert call_with_timeout(lambda: 4, None, "verifier") == 4
    with pytest.raises(ZeroDivisionError):
        call_with_timeout(lambda: 1 / 0, 1.0, "verifier")


def test_a_hung_call_times_out_and_is_abandoned():
    release = threading.Event()
    start = time.perf_counter()
    with pytest.raises(TimeoutError, match="verifier did not return within 0.2 s"):
        call_with_timeout(lambda: release.wait(30), 0.2, "verifier")
    assert time.perf_counter() - start < 5
    release.set()


def test_a_busy_python_loop_times_out():
    # A pure-Python loop gives up the interpreter lock regularly, so the caller's wait ends on time.
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    with pytest.raises(TimeoutError):
        call_with_timeout(spin, 0.2, "verifier")
    stop.set()


@pytest.mark.parametrize(("answer", "expected"), [(" 17 ", "17"), (17, "17"), (2.5, "2.5"), ("  ", None), (None, None)])
def test_an_answer_is_text_a_number_or_none(answer, expected):
    assert normalise_answer(answer) == expected


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        (["17"], r"a list \(\['17'\]\)"),
        (("1", "2"), r"a tuple \(\('1', '2'\)\)"),
        (True, r"a bool \(True\)"),
        ({"a": 1}, r"a dict \(\{'a': 1\}\)"),
    ],
)
def test_any_other_answer_names_its_type_and_the_fix(answer, named):
    # Their text (a list of matches, a verifier's pass flag) never equals a gold answer, so every outcome would be wrong.
    with pytest.raises(TypeError, match=f"answer_extractor returned {named}, not an answer; return the final answer"):
        normalise_answer(answer)
