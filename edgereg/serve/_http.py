"""Pure HTTP helpers: request-target checks, entity tags and byte ranges (RFC 9110).

Nothing here touches a socket or the registry; every function takes header
strings and returns values, so the rules are tested on their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

# Percent-encodings that would change how a path splits into segments, or
# smuggle a NUL: refused outright instead of decoded.
_DANGEROUS_ESCAPES = re.compile(r"%(2f|5c|00)", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ETAG = re.compile(r'\s*(W/)?("[\x21\x23-\x7e\x80-\xff]*")\s*(?:,|$)')


class BadTarget(ValueError):
    """The request target is not a plain path this server will even look at."""


def request_path(target: str) -> str:
    r"""Return the decoded path of an origin-form request target.

    The query string is dropped (the registry has no dynamic resources).

    Raises:
        BadTarget: not a path starting with '/', a '.' or '..' segment (plain
            or percent-encoded), an encoded '/' or '\\', a backslash, a NUL,
            a control character, invalid percent-encoding or non-ASCII bytes.
    """
    if not target.startswith("/"):
        raise BadTarget("the request target must be a path starting with '/'")
    path = target.split("?", 1)[0].split("#", 1)[0]
    if "%" in path:
        if _DANGEROUS_ESCAPES.search(path):
            raise BadTarget("encoded '/', '\\' or NUL in the path")
        if re.search(r"%(?![0-9A-Fa-f]{2})", path):
            raise BadTarget("invalid percent-encoding in the path")
        try:
            path = unquote_to_bytes(path).decode("ascii")
        except UnicodeDecodeError as exc:
            raise BadTarget("non-ASCII bytes in the path") from exc
    if not path.isascii() or _CONTROL.search(path):
        raise BadTarget("control or non-ASCII characters in the path")
    if "\\" in path:
        raise BadTarget("backslash in the path")
    if any(part in (".", "..") for part in path.split("/")):
        raise BadTarget("'.' or '..' segment in the path")
    return path


def quote_etag(hex_digest: str) -> str:
    """The strong entity tag for a representation whose sha256 is ``hex_digest``."""
    return f'"{hex_digest}"'


def parse_etags(value: str) -> list[str] | None:
    """Parse an If-None-Match / If-Match value into opaque tags (without ``W/``).

    Returns:
        The tags, ``["*"]`` for ``*``, or None when the value is malformed
        (a malformed condition is ignored, as RFC 9110 allows).
    """
    text = value.strip()
    if text == "*":
        return ["*"]
    tags: list[str] = []
    pos = 0
    while pos < len(text):
        match = _ETAG.match(text, pos)
        if match is None:
            return None
        tags.append(match.group(2))
        pos = match.end()
    return tags or None


def none_match(if_none_match: str | None, etag: str) -> bool:
    """True when If-None-Match says the client already holds ``etag`` (answer 304).

    If-None-Match uses the weak comparison: ``W/"x"`` matches ``"x"``.
    """
    if if_none_match is None:
        return False
    if if_none_match == etag:  # what a client sends back, as it was given
        return True
    tags = parse_etags(if_none_match)
    if tags is None:
        return False
    return tags == ["*"] or etag in tags


@dataclass(frozen=True)
class ByteRange:
    """A satisfiable byte range: ``length`` bytes from ``start`` of a ``size``-byte body."""

    start: int
    length: int
    size: int

    @property
    def end(self) -> int:
        """The last byte's offset (inclusive, as in Content-Range)."""
        return self.start + self.length - 1

    def content_range(self) -> str:
        """The Content-Range value of a 206 answer."""
        return f"bytes {self.start}-{self.end}/{self.size}"


class Unsatisfiable(ValueError):
    """A bytes range that this body cannot satisfy: answer 416."""


_RANGE_SPEC = re.compile(r"^\s*([0-9]{0,18})\s*-\s*([0-9]{0,18})\s*$")


def parse_range(value: str | None, size: int) -> ByteRange | None:
    """Interpret a Range header for a body of ``size`` bytes.

    Only a single ``bytes`` range is served: ``bytes=a-b``, ``bytes=a-`` or
    the suffix ``bytes=-n``. A range reaching past the end is cut to the end.

    Returns:
        The range to send (206), or None to send the whole body (200): no
        Range header, another unit, or several ranges (RFC 9110 lets a
        server ignore Range; clients that resume ask for one).

    Raises:
        Unsatisfiable: a malformed ``bytes`` range, last before first, a
            start at or past the end, or an empty suffix (416).
    """
    if value is None:
        return None
    unit, sep, specs = value.partition("=")
    if not sep or unit.strip().lower() != "bytes":
        return None
    if "," in specs:
        return None
    match = _RANGE_SPEC.fullmatch(specs)
    if match is None:
        raise Unsatisfiable(f"malformed range {specs.strip()!r}")
    first, last = match.group(1), match.group(2)
    if first == "" and last == "":
        raise Unsatisfiable("a range needs a first or a last byte position")
    if first == "":
        suffix = int(last)
        if suffix == 0 or size == 0:
            raise Unsatisfiable("an empty suffix range")
        length = min(suffix, size)
        return ByteRange(size - length, length, size)
    start = int(first)
    if last != "" and int(last) < start:
        raise Unsatisfiable(f"the range ends ({last}) before it starts ({start})")
    if start >= size:
        raise Unsatisfiable(f"the range starts at {start}, the body has {size} bytes")
    end = size - 1 if last == "" else min(int(last), size - 1)
    return ByteRange(start, end - start + 1, size)


def if_range_matches(if_range: str | None, etag: str) -> bool:
    """Whether a Range may be honoured under If-Range (strong comparison).

    A date (this server sends no Last-Modified) or a weak tag never matches,
    so the client gets the whole current body.
    """
    if if_range is None:
        return True
    return if_range.strip() == etag
