"""How error messages quote a user's text: whole words, a closed quote, and a mark where it was cut."""

from __future__ import annotations

import json
import textwrap
from typing import Any

__all__ = ["quoted"]


def quoted(text: Any, width: int = 80) -> str:
    """`text` (a prompt: a string, or conversational messages) quoted in at most about `width` characters, cut at a
    word with `...` rather than mid-word with the quote left open."""
    if not isinstance(text, str):
        text = json.dumps(text, default=str)
    return repr(textwrap.shorten(text, width, placeholder=" ..."))
