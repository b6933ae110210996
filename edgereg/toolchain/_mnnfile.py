"""Pure reading and patching of the bytes of an ``.mnn`` file (no MNN import).

An ``.mnn`` file is a FlatBuffer whose root table is ``MNN.Net``
(``schema/default/MNN.fbs``). The converter fills its ``mnn_uuid`` string field
with a random UUID4 at every conversion, which makes two conversions of the
same model differ in exactly those 36 bytes. Locating the field through the
FlatBuffer tables (not by searching the bytes for something that looks like a
UUID) guarantees we patch the field and nothing else.
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass

#: Index of ``mnn_uuid`` among the fields of ``table Net`` in MNN.fbs
#: (bizCode, extraTensorDescribe, extraInfo, oplists, outputName,
#: preferForwardType, sourceType, tensorName, tensorNumber, usage, subgraphs,
#: mnn_uuid).
NET_MNN_UUID_FIELD = 11

UUID_LENGTH = 36
_UUID_RE = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)


class MnnFormatError(ValueError):
    """The bytes are not an ``.mnn`` FlatBuffer this module can read."""


@dataclass(frozen=True)
class UuidField:
    """Where the ``mnn_uuid`` string sits in a file.

    Attributes:
        offset: Byte offset of the first character of the UUID.
        value: The UUID as stored (36 ASCII characters).
    """

    offset: int
    value: str


def read_scalar(data: bytes, pos: int, fmt: str) -> int:
    """One little-endian FlatBuffer scalar (``<I``, ``<i``, ``<H``) at ``pos``, bounds-checked."""
    size = struct.calcsize(fmt)
    if pos < 0 or pos + size > len(data):
        raise MnnFormatError(f"offset {pos} is outside the {len(data)}-byte file")
    value: int = struct.unpack_from(fmt, data, pos)[0]
    return value


def _u32(data: bytes, pos: int) -> int:
    return read_scalar(data, pos, "<I")


def _u16(data: bytes, pos: int) -> int:
    return read_scalar(data, pos, "<H")


def find_uuid(data: bytes) -> UuidField | None:
    """Locate the ``mnn_uuid`` field of an ``.mnn`` file.

    Args:
        data: The whole file.

    Returns:
        The field, or None when the model has no UUID (models written by the
        quantizer's EMA path, for example).

    Raises:
        MnnFormatError: The bytes are not a FlatBuffer with a ``Net`` root, or
            the field holds something other than a 36-character UUID.
    """
    table = _u32(data, 0)
    vtable = table - struct.unpack_from("<i", data, table)[0] if table + 4 <= len(data) else -1
    vtable_size = _u16(data, vtable)
    slot = 4 + 2 * NET_MNN_UUID_FIELD
    if vtable_size < 4 or vtable_size % 2:
        raise MnnFormatError(f"vtable size {vtable_size} is not a FlatBuffer vtable")
    if slot + 2 > vtable_size:
        return None
    field_offset = _u16(data, vtable + slot)
    if field_offset == 0:
        return None
    field_pos = table + field_offset
    string_pos = field_pos + _u32(data, field_pos)
    length = _u32(data, string_pos)
    start = string_pos + 4
    if length == 0:
        return None
    if length != UUID_LENGTH or start + length >= len(data) or data[start + length] != 0:
        raise MnnFormatError(
            f"mnn_uuid field holds {length} bytes at offset {start}; expected a "
            f"{UUID_LENGTH}-character NUL-terminated UUID"
        )
    raw = data[start : start + length]
    if not _UUID_RE.fullmatch(raw):
        raise MnnFormatError(f"mnn_uuid field holds {raw!r}, which is not a UUID")
    return UuidField(offset=start, value=raw.decode("ascii"))


def derive_uuid(seed: bytes) -> str:
    """Derive a UUID from ``seed``: SHA-256, first 16 bytes, as UUIDv8.

    RFC 9562 version 8 is the "custom" version, meant for exactly this: a
    UUID computed by a hash the application chooses.

    Args:
        seed: Bytes that identify the build inputs.

    Returns:
        36 lowercase characters, ``8-4-4-4-12`` hex, same length as the
        converter's UUID4.
    """
    raw = bytearray(hashlib.sha256(seed).digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x80  # version 8
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 9562 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def replace_uuid(data: bytes, new_uuid: str) -> tuple[bytes, UuidField | None]:
    """Return ``data`` with its ``mnn_uuid`` replaced by ``new_uuid``.

    Args:
        data: The whole ``.mnn`` file.
        new_uuid: 36-character UUID to write.

    Returns:
        The patched bytes and the old field (None, with ``data`` unchanged,
        when the model carries no UUID).

    Raises:
        MnnFormatError: The file cannot be read, ``new_uuid`` is not a UUID, or
            the old UUID appears more than once in the file (so replacing the
            field would not make the file depend only on its inputs).
    """
    encoded = new_uuid.encode("ascii")
    if not _UUID_RE.fullmatch(encoded):
        raise MnnFormatError(f"{new_uuid!r} is not a 36-character UUID")
    field = find_uuid(data)
    if field is None:
        return data, None
    occurrences = data.count(field.value.encode("ascii"))
    if occurrences != 1:
        raise MnnFormatError(f"mnn_uuid {field.value} occurs {occurrences} times; expected once")
    end = field.offset + UUID_LENGTH
    return data[: field.offset] + encoded + data[end:], field
