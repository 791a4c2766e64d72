"""Calling user code that may hang or raise, such as a verifier, with a bound on its wall-clock time."""

from __future__ import annotations

import numbers
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# Seconds one verifier call may take by default, in training (`CGRPOConfig.verifier_timeout_s`) and evaluation.
VERIFIER_TIMEOUT_S = 300.0


def call_with_timeout(func: Callable[[], T], timeout_s: float | None, what: str) -> T:
    """``func()``, or TimeoutError when it has not returned after ``timeout_s`` seconds (None: no bound).

    The call runs in a daemon thread, which Python cannot kill: a call that times out is abandoned and may go on
    using a CPU until the process ends. Code that runs untrusted programs should bound them itself, in subprocesses,
    as the code task's sandbox does; this bound keeps a hung call from stalling training forever.
    """
    if timeout_s is None:
        return func()
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["value"] = func()
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread below
            outcome["error"] = error

    thread = threading.Thread(target=target, name=f"cgrpo-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not return within {timeout_s:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def verify(
    verifier, texts: list[str], columns: dict[str, Any], timeout_s: float | None, on_error: Callable[[Exception], None]
) -> list[bool]:
    """`verifier`'s verdict on each of one prompt's completions `texts`, given the prompt's other `columns`.

    A verifier that raises, or has not returned after `timeout_s` seconds (None: no bound), fails every completion
    and `on_error` gets the error: it is user code, and one bad call should not crash a run or stall it forever.
    """
    try:
        passes = list(call_with_timeout(lambda: verifier(completions=texts, **columns), timeout_s, "verifier"))
    except Exception as error:  # noqa: BLE001 - user code: a verifier that raises is a fail, not a crash
        on_error(error)
        return [False] * len(texts)
    if len(passes) != len(texts):
        raise ValueError(
            f"verifier returned {len(passes)} results for {len(texts)} completions; return one bool per completion."
        )
    return [bool(p) for p in passes]


def normalise_answer(answer) -> str | None:
    """An answer extractor's output as compared with gold answers: stripped text, None when there is none.

    A number is compared as its text. Anything else is refused: the text of a list of matches or of a pass/fail flag
    (an extractor written like a regex search or a verifier) would never equal a gold answer, so every outcome would
    silently count as a wrong answer.
    """
    if answer is None:
        return None
    if isinstance(answer, bool) or not isinstance(answer, (str, numbers.Number)):
        raise TypeError(
            f"answer_extractor returned a {type(answer).__name__} ({answer!r:.60}), not an answer; return the final "
            "answer as a str (say the last match, not the list of matches), or None when the completion has none."
        )
    answer = str(answer).strip()
    return answer or None


def completion_text(completion) -> str:
    """A completion's text, for plain and conversational (list of messages) completions alike."""
    if isinstance(completion, str):
        return completion
    return "".join(m["content"] for m in completion if isinstance(m.get("content"), str))
