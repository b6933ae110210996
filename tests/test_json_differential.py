"""Every client's strict JSON parser against the Python reference's, on generated bad input.

The envelope is strict JSON (docs/protocol.md §2): two parsers that disagree
on a duplicate key, a NaN or a 60,000-deep document would see two documents
behind one signature. Each client's device program (``check_json``) gets
byte strings and JSON-ish texts from hypothesis (duplicate keys, deep
nesting, big integers, floats, NaN and Infinity literals, escapes, invalid
UTF-8, trailing garbage) plus a table of named edge cases; its verdict must
be the one of :func:`edgereg.protocol.strict_json_loads`, and the program
must still answer afterwards (no crash). One long-lived program per client.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from devicekit import DeviceProgram, selected_clients, spawn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgereg.protocol import MAX_JSON_DEPTH, strict_json_loads


def reference(data: bytes) -> bool:
    """The Python reference's verdict."""
    try:
        strict_json_loads(data)
    except (ValueError, RecursionError):
        return False
    return True


@pytest.fixture(scope="module", params=selected_clients())
def program(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DeviceProgram]:
    client: str = request.param
    log = tmp_path_factory.mktemp("json-differential") / f"{client}.log"
    started = spawn(client, log)
    yield started
    if started.process.poll() is None:
        started.quit()


def verdict(program: DeviceProgram, data: bytes) -> bool:
    result = program.request("check_json", data=base64.b64encode(data).decode("ascii"))
    valid = result.get("valid")
    assert isinstance(valid, bool), f"{program.client} check_json answered {result!r}"
    return valid


def assert_same(program: DeviceProgram, data: bytes) -> None:
    expected = reference(data)
    got = verdict(program, data)
    assert got == expected, (
        f"{program.client} says {'valid' if got else 'invalid'}, the Python reference says "
        f"{'valid' if expected else 'invalid'}: {data[:300]!r}"
    )


# --- named edge cases -------------------------------------------------------------------

DEEP_OK = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
DEEP_BAD = b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)
EDGE_CASES: dict[str, bytes] = {
    "empty": b"",
    "whitespace-only": b" \t\r\n",
    "object": b'{"a":1}',
    "scalar-top-level": b"3",
    "string-top-level": b'"x"',
    "leading-and-trailing-whitespace": b' \n{"a":[1,2]}\t\r\n',
    "duplicate-key": b'{"a":1,"a":2}',
    "duplicate-key-nested": b'{"a":{"b":1,"b":1}}',
    "duplicate-key-in-array": b'[{"k":null},{"k":null,"k":null}]',
    "same-key-different-escape": b'{"a":1,"\\u0061":2}',
    "nan": b'{"a":NaN}',
    "infinity": b"[Infinity]",
    "minus-infinity": b"[-Infinity]",
    "nan-top-level": b"NaN",
    "depth-at-limit": DEEP_OK,
    "depth-over-limit": DEEP_BAD,
    "depth-60000": b"[" * 60_000,
    "deep-objects-over-limit": b'{"a":' * (MAX_JSON_DEPTH + 1) + b"1" + b"}" * (MAX_JSON_DEPTH + 1),
    "brackets-inside-strings": b'["' + b"[" * 100 + b'"]',
    "big-int": b"[123456789012345678901234567890]",
    # Integers: a double's range decides (docs/protocol.md section 2), not a digit limit.
    "int-largest-double": f"[{int(1.7976931348623157e308)}]".encode(),
    "int-309-digits-past-double": b"[" + b"9" * 309 + b"]",
    "int-rounds-to-infinity": f"[{2**1024 - 2**970}]".encode(),
    "int-rounds-to-largest-double": f"[{2**1024 - 2**970 - 1}]".encode(),
    "int-310-digits": b"[1" + b"0" * 309 + b"]",
    "negative-int-310-digits": b"[-1" + b"0" * 309 + b"]",
    "int-4300-digits": b"[" + b"9" * 4300 + b"]",
    "int-4301-digits": b"[" + b"9" * 4301 + b"]",
    "float-huge-exponent": b"[1e400]",
    "float-tiny-exponent": b"[1e-400]",
    "negative-zero": b"[-0]",
    "negative-zero-float": b"[-0.0]",
    "leading-zero": b"[01]",
    "trailing-dot": b"[1.]",
    "leading-dot": b"[.5]",
    "plus-sign": b"[+1]",
    "hex": b"[0x10]",
    "exponent-without-digits": b"[1e]",
    "true-false-null": b"[true,false,null]",
    "capitalised-literal": b"[True]",
    "single-quotes": b"['a']",
    "trailing-comma-array": b"[1,]",
    "trailing-comma-object": b'{"a":1,}',
    "trailing-garbage": b'{"a":1}x',
    "two-documents": b'{"a":1}{"b":2}',
    "unquoted-key": b"{a:1}",
    "comment": b'{"a":1 /* c */}',
    "escapes": b'["\\n\\t\\"\\\\\\/\\b\\f\\r\\u00e9\\ud83d\\ude00"]',
    # Lone surrogate escapes are malformed (docs/protocol.md section 2); pairs are text.
    "lone-high-surrogate-escape": b'["\\ud800"]',
    "lone-low-surrogate-escape": b'["\\udc00"]',
    "high-surrogate-then-not-low": b'["\\ud800\\u0041"]',
    "low-then-high-surrogate": b'["\\udc00\\ud800"]',
    "high-surrogate-at-end-of-string": b'["\\ud800","\\udc00"]',
    "high-surrogate-then-literal-pair": '["\\ud83d😀"]'.encode(),
    "lone-surrogate-in-key": b'{"\\udbff":1}',
    "lone-surrogate-in-nested-value": b'{"a":[{"b":"x\\udfffy"}]}',
    "surrogate-pair-escape": b'["\\ud83d\\ude00"]',
    "surrogate-pair-escape-uppercase": b'["\\uD83D\\uDE00"]',
    "escaped-backslash-then-ud800": b'["\\\\ud800"]',
    "bad-escape": b'["\\x41"]',
    "short-unicode-escape": b'["\\u12"]',
    "raw-control-character": b'["a\x01b"]',
    "raw-newline-in-string": b'["a\nb"]',
    "raw-del-in-string": b'["a\x7fb"]',
    "utf8-multibyte": '["é€😀"]'.encode(),
    "invalid-utf8": b'["\xff"]',
    "overlong-utf8": b'["\xc0\xaf"]',
    "utf8-encoded-surrogate": b'["\xed\xa0\x80"]',
    "truncated-utf8": b'["\xe2\x82"]',
    "utf8-bom": b'\xef\xbb\xbf{"a":1}',
    "utf16": '{"a":1}'.encode("utf-16"),
    "nul-byte": b'{"a":1}\x00',
    "unterminated-string": b'["abc',
    "unterminated-array": b"[1,2",
    "key-not-string": b"{1:2}",
    "nested-empty": b'{"a":[],"b":{},"c":""}',
}


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("lone-high-surrogate-escape", False),
        ("lone-low-surrogate-escape", False),
        ("high-surrogate-then-not-low", False),
        ("low-then-high-surrogate", False),
        ("high-surrogate-at-end-of-string", False),
        ("high-surrogate-then-literal-pair", False),
        ("lone-surrogate-in-key", False),
        ("lone-surrogate-in-nested-value", False),
        ("surrogate-pair-escape", True),
        ("surrogate-pair-escape-uppercase", True),
        ("escaped-backslash-then-ud800", True),
    ],
)
def test_the_reference_refuses_lone_surrogate_escapes(name: str, valid: bool) -> None:
    """The rule itself, so every client agreeing with a wrong reference cannot pass."""
    assert reference(EDGE_CASES[name]) is valid


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_named_edge_cases_get_the_reference_verdict(program: DeviceProgram, name: str) -> None:
    assert_same(program, EDGE_CASES[name])


# --- generated input ------------------------------------------------------------------------

_WS = st.sampled_from(["", "", "", " ", "\n", "\t", "\r\n", "  "])
_DIGITS = st.text(alphabet="0123456789", min_size=1, max_size=25)
_GRAMMAR_NUMBER = st.tuples(
    st.sampled_from(["", "-"]),
    st.one_of(st.just("0"), st.tuples(st.sampled_from("123456789"), _DIGITS).map("".join)),
    st.one_of(st.just(""), _DIGITS.map(lambda d: "." + d)),
    st.one_of(
        st.just(""),
        st.tuples(
            st.sampled_from("eE"), st.sampled_from(["", "+", "-"]), _DIGITS.map(lambda d: d[:4])
        ).map("".join),
    ),
).map("".join)
_NUMBER = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.integers(min_value=0, max_value=6000).map(lambda n: "1" + "0" * n),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    _GRAMMAR_NUMBER,
    # Near misses of the number grammar.
    st.text(alphabet="0123456789.eE+-", min_size=1, max_size=8),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "-0", "0x1F", "1_000", "nan", "inf"]),
)
_GOOD_ESCAPES = [
    "\\n",
    "\\t",
    '\\"',
    "\\\\",
    "\\/",
    "\\b",
    "\\f",
    "\\r",
    "\\u0041",
    "\\ud83d\\ude00",
]
_ODD_ESCAPES = [
    "\\ud800",
    "\\udfff",
    "\\ud83d",
    "\\ude00",
    "\\u00",
    "\\x41",
    "\\'",
    "\\U0041",
    "\\",
]
_ESCAPE = st.sampled_from([*_GOOD_ESCAPES, *_ODD_ESCAPES])
_STRING = st.lists(
    st.one_of(st.text(max_size=6).filter(lambda t: '"' not in t and "\\" not in t), _ESCAPE),
    max_size=4,
).map(lambda parts: '"' + "".join(parts) + '"')
_KEYS = st.sampled_from(['"a"', '"b"', '"\\u0061"', '"payload"', '""', '"k"'])
_SCALAR = st.one_of(st.sampled_from(["null", "true", "false"]), _NUMBER, _STRING)


def _texts() -> st.SearchStrategy[str]:
    def extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        array = st.lists(children, max_size=4).map(lambda items: "[" + ",".join(items) + "]")
        # Few distinct keys, so duplicates come up often.
        pair = st.tuples(_KEYS, _WS, children).map(lambda p: f"{p[0]}:{p[1]}{p[2]}")
        obj = st.lists(pair, max_size=4).map(lambda pairs: "{" + ",".join(pairs) + "}")
        return st.one_of(array, obj)

    document = st.recursive(_SCALAR, extend, max_leaves=12)
    nested = st.tuples(st.integers(MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH + 3), document).map(
        lambda p: "[" * p[0] + p[1] + "]" * p[0]
    )
    garbage = st.tuples(
        document, st.sampled_from(["", "x", ",", "]", "}", "{}", "[]", " 1", "\x00", "//"])
    ).map("".join)
    return st.tuples(_WS, st.one_of(document, document, nested, garbage), _WS).map("".join)


def _corrupt(text: str, data: st.DataObject) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    if raw and data.draw(st.booleans(), label="splice"):
        at = data.draw(st.integers(0, len(raw)), label="at")
        bad = data.draw(
            st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\x80", b"\x00"]),
            label="bytes",
        )
        raw = raw[:at] + bad + raw[at:]
    return raw


GENERATED = settings(
    max_examples=900,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)


@settings(GENERATED, max_examples=800)
@given(data=st.binary(max_size=120))
def test_random_bytes_get_the_reference_verdict(program: DeviceProgram, data: bytes) -> None:
    assert_same(program, data)


@GENERATED
@given(text=_texts(), data=st.data())
def test_json_ish_texts_get_the_reference_verdict(
    program: DeviceProgram, text: str, data: st.DataObject
) -> None:
    assert_same(program, _corrupt(text, data))


@settings(GENERATED, max_examples=200)
@given(
    value=st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False)
        | st.text(max_size=8),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=3), children, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_real_json_documents_get_the_reference_verdict(
    program: DeviceProgram, value: object
) -> None:
    data = json.dumps(value, allow_nan=True).encode()
    assert_same(program, data)


def test_the_program_survived_every_input(program: DeviceProgram, tmp_path: Path) -> None:
    assert program.request("hello")["client"] == program.client
    assert program.process.poll() is None
