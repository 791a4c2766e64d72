"""Final-answer formats: extracting, normalising and checking the number a text ends with; and what a worked
solution computes (:func:`computation_signature`), which tells problems apart beyond their wording.

Numbers are normalised as strings (never through ``float``) so that huge integers and long decimals
compare exactly: ``"1,234"``, ``" +1234. "`` and ``"1234.00"`` all become ``"1234"``.
"""

from __future__ import annotations

import re

ANSWER_FORMATS = ("hash", "boxed")

_NUMBER = re.compile(r"([+-]?)\$?(\d*)(?:\.(\d+))?")
# Typeset text and some models write minus as U+2212 (or a figure/en dash) instead of ASCII "-".
_MINUS_SIGNS = str.maketrans({"\u2212": "-", "\u2012": "-", "\u2013": "-"})
_BOXED = "\\boxed{"
# LaTeX markup models put around a number inside \boxed{}, removed in this order before parsing; anything
# else (\frac, \sqrt, words) is left alone so that it still fails as "not a plain number".
_LATEX_MARKUP = (
    (re.compile(r"\{,\}"), ","),  # 1{,}234: braces stop TeX spacing the thousands comma like punctuation
    (re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}]*)\}"), r"\1"),  # font wrappers: keep the content
    (re.compile(r"\\[,!;: ]"), ""),  # thin, negative and other explicit spaces: 12\,000
    (re.compile(r"\\?[$%]"), ""),  # units, escaped or not, and $...$ math delimiters: \$12, 12\%
    (re.compile(r"\^\{?\\circ\}?"), ""),  # degrees: 90^\circ, 90^{\circ}
)
# One step of a worked solution: numbers joined by operators (parentheses allowed), "=", the number it gives. GSM8K
# writes its steps as calculator annotations ("<<48/2=24>>"), the arithmetic task as plain "3*4=12".
_OPERAND = r"\(*\d[\d,]*(?:\.\d+)?\)*"
_EQUATION = re.compile(rf"({_OPERAND}(?:\s*[-+*/]\s*{_OPERAND})+)\s*=\s*(-?\d[\d,]*(?:\.\d+)?)")
_NUMBER_IN_TEXT = re.compile(r"\d[\d,]*(?:\.\d+)?")


def check_answer_format(answer_format: str) -> None:
    """Raise ValueError unless ``answer_format`` is one of :data:`ANSWER_FORMATS`."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"Unknown answer_format {answer_format!r}; use one of {', '.join(ANSWER_FORMATS)}.")


def normalize_number(text: str) -> str | None:
    """Return the canonical string form of the number in ``text``, or None if it is not a plain number.

    Commas, whitespace and a leading ``$`` are ignored, a trailing period is dropped, unicode minus
    signs count as ``-``, ``+5`` becomes ``5``, ``3.0`` becomes ``3`` and ``-0`` becomes ``0``.
    """
    cleaned = "".join(text.split()).replace(",", "").translate(_MINUS_SIGNS)
    match = _NUMBER.fullmatch(cleaned.removesuffix("."))
    if match is None or not (match.group(2) or match.group(3)):
        return None
    sign, integer, fraction = match.groups()
    integer = integer.lstrip("0") or "0"
    fraction = (fraction or "").rstrip("0")
    number = f"{integer}.{fraction}" if fraction else integer
    return number if number == "0" or sign != "-" else "-" + number


def _hash_tail(text: str) -> str | None:
    """Text after the last ``####``, or None if there is no marker."""
    marker = text.rfind("####")
    return None if marker < 0 else text[marker + 4 :]


def _strip_latex(text: str) -> str:
    """``text`` without the number markup of :data:`_LATEX_MARKUP`: ``\\text{1{,}234}\\%`` becomes ``1,234``."""
    for pattern, replacement in _LATEX_MARKUP:
        text = pattern.sub(replacement, text)
    return text


def _boxed_tail(text: str) -> tuple[str, str] | None:
    """(content, rest) of the last ``\\boxed{...}`` with balanced braces, or None if there is none."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, begin = 1, start + len(_BOXED)
    for index in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[begin:index], text[index + 1 :]
    return None


def extract_answer(text: str, answer_format: str = "hash") -> str | None:
    """Normalised number after the last ``####`` (or inside the last ``\\boxed{}``), else None.

    With the hash format only the first non-empty line after the marker counts, so
    ``"#### 26\\nThanks"`` gives ``"26"`` while ``"#### 26 apples"`` gives None. Boxed content may wrap
    the number in LaTeX markup (``\\text{}``, ``{,}``, ``\\,``, ``\\$``, ``\\%``, ``^\\circ``; see
    :data:`_LATEX_MARKUP`), so ``\\boxed{\\$1{,}234}`` gives ``"1234"``; ``\\boxed{\\frac{1}{2}}`` gives None.
    """
    check_answer_format(answer_format)
    if answer_format == "boxed":
        boxed = _boxed_tail(text)
        return None if boxed is None else normalize_number(_strip_latex(boxed[0]))
    tail = _hash_tail(text)
    if tail is None or not tail.strip():
        return None
    return normalize_number(tail.strip().splitlines()[0])


def is_well_formed(text: str, answer_format: str = "hash") -> bool:
    """True if ``text`` ends (trailing whitespace allowed) with ``#### <number>`` or ``\\boxed{<number>}``."""
    check_answer_format(answer_format)
    if answer_format == "boxed":
        boxed = _boxed_tail(text)
        return boxed is not None and not boxed[1].strip() and normalize_number(_strip_latex(boxed[0])) is not None
    tail = _hash_tail(text)
    return tail is not None and "\n" not in tail.strip() and normalize_number(tail) is not None


def parse_gold(solution: str) -> str:
    """Normalised final answer of a worked solution ending in ``#### N`` or ``\\boxed{N}``.

    Reference data keeps its own marker whatever format the model is asked for (GSM8K always uses
    ``####``), so both markers are accepted here.
    """
    fmt = "hash" if "####" in solution else "boxed"
    gold = extract_answer(solution, fmt)
    if gold is None:
        raise ValueError(
            f"Solution {solution[-60:]!r} does not end in '#### <number>' or '\\boxed{{<number>}}'; "
            "fix the data or drop that example."
        )
    return gold


def format_answer(number: str, answer_format: str = "hash") -> str:
    """The final-answer suffix a completion should end with, e.g. ``#### 26`` or ``\\boxed{26}``."""
    check_answer_format(answer_format)
    return f"#### {number}" if answer_format == "hash" else f"{_BOXED}{number}}}"


def computation_signature(solution: str) -> tuple[str, ...] | None:
    """The equations of a worked solution, in order and normalised (``"3*4=12 12+5=17 #### 17"`` gives ``("3*4=12",
    "12+5=17")``), or None when it shows none.

    What a problem computes, whatever its wording: two problems about other people and things with the same
    operations on the same numbers have the same signature. Operands keep the order the solution writes them in, so
    ``3*4`` and ``4*3`` differ.
    """
    equations = [
        _NUMBER_IN_TEXT.sub(lambda number: normalize_number(number.group()), "".join(left.split()))
        + "="
        + normalize_number(right)
        for left, right in _EQUATION.findall(solution)
    ]
    return tuple(equations) or None
