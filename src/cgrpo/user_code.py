"""Calling user code that may hang, such as a verifier, with a bound on its wall-clock time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


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
