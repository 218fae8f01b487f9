"""CRC-32 arithmetic of the write-ahead log's records (standard library only).

A record's CRC (``zlib.crc32``) covers its type byte and its payload; :data:`TYPE_CRC` starts
that CRC from the type byte without building the concatenation. The rest works on CRCs without
the bytes: :func:`stream_entries_crc` finds the CRC of a stream chunk's entries alone from its
record's CRC (what the stream protocol's chunk head carries), :func:`crc32_before` takes a
short suffix back off a CRC.
"""

from __future__ import annotations

import functools
import zlib

__all__ = ["TYPE_CRC", "crc32_shifted", "stream_entries_crc", "crc32_before"]

#: ``zlib.crc32`` of each possible type byte: the CRC of a record is
#: ``crc32(payload, TYPE_CRC[type])``, which equals ``crc32(type byte + payload)`` without
#: building that concatenation.
TYPE_CRC = [zlib.crc32(bytes((value,))) for value in range(256)]


def _gf2_times(matrix: list[int], vector: int) -> int:
    total = at = 0
    while vector:
        if vector & 1:
            total ^= matrix[at]
        vector >>= 1
        at += 1
    return total


@functools.cache
def _zero_bytes_operators() -> list[list[int]]:
    """For each ``k``, the linear map that runs a CRC-32 register over ``2**k`` zero bytes
    (zlib's ``crc32_combine``'s matrices), built once, when first needed (about 2 ms)."""
    operator = [0xEDB88320] + [1 << n for n in range(31)]  # one zero bit
    operators = []
    for step in range(34):
        operator = [_gf2_times(operator, row) for row in operator]  # twice as many
        if step >= 2:  # eight bits on
            operators.append(operator)
    return operators


def crc32_shifted(crc: int, length: int) -> int:
    """What ``crc`` becomes run over ``length`` zero bytes, less what 0 does: for any ``data``
    of that length, ``zlib.crc32(data, crc) ^ crc32_shifted(crc, length) == zlib.crc32(data)``.
    Costs about 20 µs, however long ``length`` is."""
    operators = _zero_bytes_operators()
    at = 0
    while length:
        if length & 1:
            crc = _gf2_times(operators[at], crc)
        length >>= 1
        at += 1
    return crc


def stream_entries_crc(record_crc: int, record_type: int, head: bytes, length: int) -> int:
    """The CRC-32 of a stream chunk record's ``length`` bytes of entries alone (as osiris's
    chunk head carries it), from the record's own CRC (over its type, its ``head`` and the
    entries), without reading the entries. Damage to them since the record was written then
    shows in the reader's check of the chunk."""
    return record_crc ^ crc32_shifted(zlib.crc32(head, TYPE_CRC[record_type]), length)


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
        table.append(crc)
    return table


_CRC_TABLE = _crc_table()
#: The index of each CRC table entry by its top byte (unique in CRC-32's table).
_CRC_BY_TOP = {entry >> 24: index for index, entry in enumerate(_CRC_TABLE)}


def crc32_before(crc: int, suffix: bytes) -> int:
    """``zlib.crc32(data)`` from ``zlib.crc32(data + suffix)`` (``crc``) and ``suffix``: the
    CRC run back over the suffix's bytes, the last first (each step of CRC-32 can be undone
    from its input byte). For a short suffix: a Python step per byte."""
    crc ^= 0xFFFFFFFF
    for byte in reversed(suffix):
        index = _CRC_BY_TOP[crc >> 24]
        crc = (((crc ^ _CRC_TABLE[index]) << 8) & 0xFFFFFFFF) | (index ^ byte)
    return crc ^ 0xFFFFFFFF
