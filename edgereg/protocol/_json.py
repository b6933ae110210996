"""Canonical JSON out, strict JSON in: the one way edgereg documents become bytes and back."""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any

__all__ = [
    "MAX_INTEGER_DIGITS",
    "MAX_JSON_DEPTH",
    "canonical_json",
    "json_depth",
    "strict_json_loads",
]


def canonical_json(value: Any) -> bytes:
    """Return the canonical JSON bytes edgereg signs and stores.

    Keys sorted, no whitespace, UTF-8, NaN and infinities refused. The bytes
    are produced once, by the signer; verifiers check signatures over the
    bytes as received and never re-serialize, so this need not be RFC 8785.

    Raises:
        ValueError: the value holds NaN or an infinity, or is not JSON data.
    """
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects any edgereg document may have (real ones: 8)."""

_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_A_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


_WEIGHT = [0] * 256
for _open, _close in (b"[]", b"{}"):
    _WEIGHT[_open], _WEIGHT[_close] = 1, -1


def json_depth(data: bytes) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON bytes, strings skipped (no parsing)."""
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_A_BRACKET)
    if not brackets:
        return 0
    # map and accumulate run in C: a 64 KiB document costs about a millisecond.
    return max(0, max(itertools.accumulate(map(_WEIGHT.__getitem__, brackets))))


def strict_json_loads(data: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse UTF-8 JSON, refusing duplicate keys, NaN, infinities, lone surrogates, deep nesting.

    Two parsers that disagree on a duplicate key would see two documents
    behind one signature; refusing them leaves one reading. Nesting deeper
    than ``max_depth`` is refused before parsing, so 60,000 ``[`` cannot
    exhaust the parser's stack.

    Raises:
        ValueError: not UTF-8, not JSON, a duplicate key, a non-finite number, a
            string with a lone surrogate escape, or nested deeper than ``max_depth``.
    """
    # Decoded here, not by json.loads, which would guess UTF-16 or UTF-32.
    text = data.decode("utf-8")
    # No document can nest deeper than it has brackets: counting them (in C)
    # spares the string-skipping walk for the small documents that are most
    # of the traffic (a device report has about five).
    few_brackets = data.count(b"[") + data.count(b"{") <= max_depth
    depth = 0 if few_brackets else json_depth(data)
    if depth > max_depth:
        raise ValueError(f"nested {depth} levels deep, more than the limit of {max_depth}")
    # Each number is checked for a double only where one could overflow it (a Python
    # call per number, most of a small document's parsing otherwise).
    shape = data.translate(_NUMBER_SHAPE)
    if _LONG_RUN in shape or b"e000" in shape or b"e+000" in shape:
        decoder = _CHECKED_NUMBERS
    else:
        decoder = _DECODER
    try:
        value = decoder.decode(text)
    except RecursionError as exc:  # pragma: no cover - the depth check comes first
        raise ValueError("nested too deeply") from exc
    # Only a \u escape can put a surrogate in a parsed string (the UTF-8 decode above
    # refuses encoded ones, and json joins an escaped pair into one code point), so
    # the walk runs only for a document that has such an escape: a search in C.
    if _SURROGATE_ESCAPE.search(data):
        _no_lone_surrogates(value)
    return value


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_lone_surrogates(value: Any) -> None:
    r"""Refuse a string holding a lone surrogate (docs/protocol.md section 2, RFC 8259 8.2).

    ``"\ud800"``, an unpaired ``"\udc00"`` or a high surrogate followed by anything
    but a low one is no Unicode text: parsers disagree on it (replace, keep, refuse),
    so two readers of one signed document could see two different strings.
    """
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        if found:
            raise ValueError(
                f"string has a lone surrogate escape \\u{ord(found.group()):04x}: "
                "not Unicode text (a surrogate escape must be a high one followed by a low one)"
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            _no_lone_surrogates(key)
            _no_lone_surrogates(item)
    elif isinstance(value, list):
        for item in value:
            _no_lone_surrogates(item)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r}")
            seen.add(key)
    return result


MAX_INTEGER_DIGITS = 309
"""The most digits a JSON integer may have: 10^309 is past the largest double."""


def _finite_int(text: str) -> int:
    # The same rule as for a fraction or an exponent: a number no double holds
    # is refused, however it is spelled. Checked here, explicitly, so the rule
    # does not depend on CPython's int_max_str_digits (4300 by default, which
    # PYTHONINTMAXSTRDIGITS changes); 309 digits are always well inside it.
    digits = len(text.lstrip("-"))
    if digits > MAX_INTEGER_DIGITS or math.isinf(float(text)):
        raise ValueError(f"integer {text[:40]}... ({digits} digits) is too large for a double")
    return int(text)


def _finite_float(text: str) -> float:
    # 1e400 is valid JSON syntax but no double holds it; reading it as infinity
    # would smuggle in the value the NaN/infinity rule refuses (anywhere, unknown
    # keys included, since they are parsed before they are ignored).
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is too large for a double")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


#: Where no number may overflow a double: no run of 200 digits (a longer integer
#: part, or an integer, might) and no exponent of three digits, so every number is
#: below 10^(199 + 99). Found in C, not with a regex (~20x slower on a report): in
#: the bytes with every digit made 0, E made e and - made +, neither 200 zeros nor
#: "e000" nor "e+000" (elsewhere, in a string, they only cost the slow path).
_NUMBER_SHAPE = bytes.maketrans(b"123456789E-", b"000000000e+")
_LONG_RUN = b"0" * 200
# Made once (json.loads with hooks builds a decoder and its scanner per call);
# a decoder keeps no state between calls, so threads share it (as json.loads's own).
_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)
_CHECKED_NUMBERS = json.JSONDecoder(
    object_pairs_hook=_no_duplicate_keys,
    parse_constant=_no_constant,
    parse_float=_finite_float,
    parse_int=_finite_int,
)
