"""Deterministic mutations of recorded AMQP sessions: case N of seed S is always the same bytes.

:func:`make_case` draws everything from ``random.Random(f"postroom-fuzz/{seed}/{number}")``:
which session, which mutations (one to four, a few cases none), where the stream is cut into
writes, and how the socket ends. Nothing else is random, so a case can be rebuilt from its
seed and number alone (``fuzz.py --show N``) and cases can run in any order or in parallel.

Frame-level mutations work on the list of frames: drop, duplicate (up to a hundred times),
swap adjacent, insert a frame from another session, change a channel number, truncate the
session (maybe mid-frame), replace the protocol header. Byte-level mutations work inside one
frame: flip bits, set bytes to 0x00/0xff/random, insert or delete bytes, set a length field
(frame size, string and table lengths, body size) to an edge value, change a field-table
type tag, nest tables or arrays hundreds or thousands deep. Inserting and deleting fix the
frame size (and the enclosing table lengths) most of the time, so that the damage reaches
the method decoder instead of always stopping at the framer.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

from corpus import Session
from wire import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    PROTOCOL_HEADER,
    TAG_WIDTHS,
    TableSpan,
    describe_frame,
    find_tables,
    nested,
    shortstr_offsets,
    table_entry,
)

#: Share of cases sent unmutated: the happy path stays covered and a baseline for comparison.
UNMUTATED_SHARE = 0.03
#: Most mutations stacked on one case; more mostly just produce a frame error earlier.
MAX_MUTATIONS = 4
#: Nesting depths tried: shallow, near CPython's default recursion limit (1000) and beyond;
#: 15000 levels of tables (7 bytes each) still fit in the default frame_max of 131072.
NEST_DEPTHS = (8, 64, 400, 990, 1000, 1100, 3000, 15000)
#: Copies a duplicated frame may get: a pipelined burst rather than a single repeat.
DUPLICATE_COUNTS = (1, 1, 1, 2, 3, 10, 100)
#: Channel numbers to try: control, ordinary, unopened, at and over the default channel_max.
CHANNELS = (0, 1, 2, 3, 2047, 2048, 65535)
#: Protocol headers to try instead of the right one (RabbitMQ answers the wrong ones with its own).
HEADERS = (
    b"AMQP\x00\x00\x09\x00",
    b"AMQP\x01\x01\x00\x09",
    b"AMQP\x00\x00\x08\x00",
    b"AMQP",
    b"HTTP/1.1",
    b"",
    PROTOCOL_HEADER * 2,
)
#: Type tags to put in place of another: every valid one plus some RabbitMQ rejects and some
#: other implementations use (``U`` signed 16, ``c`` char in Qpid's dialect).
TAGS = bytes(TAG_WIDTHS) + b"UcZ\x00\xff"
#: How the client ends: FIN after reading, RST (SO_LINGER 0) after reading, half-close then
#: read to EOF, or close right after writing without reading anything.
ENDINGS = ("fin", "rst", "half", "abort")
ENDING_WEIGHTS = (45, 25, 20, 10)


@dataclass(frozen=True)
class Case:
    """One fuzz case: the bytes, how they are written, how the socket ends.

    :ivar number: the case number (with the seed, all it takes to rebuild it)
    :ivar session: the name of the recorded session it started from
    :ivar mutations: what was done to it, in order, for the report
    :ivar chunks: the writes, in order
    :ivar ending: one of :data:`ENDINGS`
    """

    number: int
    session: str
    mutations: tuple[str, ...]
    chunks: tuple[bytes, ...]
    ending: str

    @property
    def data(self) -> bytes:
        """The whole stream the case sends."""
        return b"".join(self.chunks)

    def describe(self) -> str:
        """One line: session, mutations, writes and ending."""
        mutations = "; ".join(self.mutations) or "unmutated"
        return (
            f"case {self.number}: {self.session}: {mutations} "
            f"[{len(self.data)} bytes in {len(self.chunks)} write(s), ending {self.ending}]"
        )


class _Draft:
    """The session being mutated."""

    def __init__(self, session: Session, sessions: list[Session]) -> None:
        self.header = session.header
        self.frames = list(session.frames)
        self.sessions = sessions


@lru_cache(maxsize=4096)
def _tables(frame: bytes) -> tuple[TableSpan, ...]:
    """The field tables in ``frame``'s payload, at frame offsets (recorded frames recur: cached)."""
    return tuple(find_tables(frame[7:-1], 7))


def _pick_frame(rng: random.Random, draft: _Draft, want: Callable[[bytes], bool] | None = None) -> int | None:
    """Index of a frame to mutate: method frames most often, or one that satisfies ``want``."""
    if not draft.frames:
        return None
    if want is not None:
        candidates = [index for index, frame in enumerate(draft.frames) if want(frame)]
        return rng.choice(candidates) if candidates else None
    if rng.random() < 0.7:
        methods = [index for index, frame in enumerate(draft.frames) if frame[:1] == bytes((FRAME_METHOD,))]
        if methods:
            return rng.choice(methods)
    return rng.randrange(len(draft.frames))


def splice(frame: bytes, at: int, delete: int, insert: bytes, fix_size: bool, fix_tables: bool) -> bytes:
    """Replace ``delete`` bytes at ``at`` with ``insert``; fix the size fields that enclose ``at``."""
    delta = len(insert) - delete
    spans = _tables(frame) if fix_tables else ()
    result = bytearray(frame[:at] + insert + frame[at + delete :])
    if fix_size and len(frame) >= 7 and at >= 7:
        size = (struct.unpack_from(">I", frame, 3)[0] + delta) % 2**32
        struct.pack_into(">I", result, 3, size)
    for span in spans:
        if span.length_at + 4 <= at and at + delete <= span.end:
            size = (struct.unpack_from(">I", frame, span.length_at)[0] + delta) % 2**32
            struct.pack_into(">I", result, span.length_at, size)
    return bytes(result)


# -- frame-level ------------------------------------------------------------------------------


def drop_frame(rng: random.Random, draft: _Draft) -> str | None:
    """Remove one frame."""
    index = _pick_frame(rng, draft)
    if index is None:
        return None
    frame = draft.frames.pop(index)
    return f"drop #{index} ({describe_frame(frame)})"


def duplicate_frame(rng: random.Random, draft: _Draft) -> str | None:
    """Repeat one frame in place, once or as a burst."""
    index = _pick_frame(rng, draft)
    if index is None:
        return None
    copies = rng.choice(DUPLICATE_COUNTS)
    draft.frames[index:index] = [draft.frames[index]] * copies
    return f"duplicate #{index} ({describe_frame(draft.frames[index])}) x{copies}"


def swap_frames(rng: random.Random, draft: _Draft) -> str | None:
    """Swap two adjacent frames."""
    if len(draft.frames) < 2:
        return None
    index = rng.randrange(len(draft.frames) - 1)
    frames = draft.frames
    frames[index], frames[index + 1] = frames[index + 1], frames[index]
    return f"swap #{index} ({describe_frame(frames[index + 1])}) and #{index + 1} ({describe_frame(frames[index])})"


def foreign_frame(rng: random.Random, draft: _Draft) -> str | None:
    """Insert a frame taken from another recorded session."""
    other = rng.choice(draft.sessions)
    if not other.frames:
        return None
    source = rng.randrange(len(other.frames))
    index = rng.randint(0, len(draft.frames))
    draft.frames.insert(index, other.frames[source])
    return f"insert {other.name} #{source} ({describe_frame(other.frames[source])}) at #{index}"


def change_channel(rng: random.Random, draft: _Draft) -> str | None:
    """Move one frame to another channel."""
    index = _pick_frame(rng, draft)
    if index is None:
        return None
    channel = rng.choice(CHANNELS) if rng.random() < 0.8 else rng.randrange(65536)
    frame = draft.frames[index]
    draft.frames[index] = frame[:1] + struct.pack(">H", channel) + frame[3:]
    return f"channel of #{index} ({describe_frame(frame)}) -> {channel}"


def truncate_session(rng: random.Random, draft: _Draft) -> str | None:
    """End the session early, at a frame boundary or inside a frame."""
    if not draft.frames:
        return None
    index = rng.randrange(len(draft.frames))
    frame = draft.frames[index]
    keep = rng.randrange(len(frame)) if rng.random() < 0.6 else 0
    draft.frames[index:] = [frame[:keep]] if keep else []
    return f"truncate at #{index} ({describe_frame(frame)}) + {keep} bytes"


def replace_header(rng: random.Random, draft: _Draft) -> str | None:
    """Send another protocol header, or none."""
    header = rng.choice(HEADERS)
    draft.header = header
    return f"protocol header -> {header!r}"


# -- byte-level -------------------------------------------------------------------------------


def flip_bits(rng: random.Random, draft: _Draft) -> str | None:
    """Flip one to four bits anywhere in one frame."""
    index = _pick_frame(rng, draft)
    if index is None or not draft.frames[index]:
        return None
    frame = bytearray(draft.frames[index])
    flipped = []
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(frame))
        bit = rng.randrange(8)
        frame[at] ^= 1 << bit
        flipped.append(f"{at}.{bit}")
    original, draft.frames[index] = draft.frames[index], bytes(frame)
    return f"flip bits {','.join(flipped)} of #{index} ({describe_frame(original)})"


def set_bytes(rng: random.Random, draft: _Draft) -> str | None:
    """Set one to four bytes of one frame's payload to 0x00, 0xff or a random value."""
    index = _pick_frame(rng, draft)
    if index is None or len(draft.frames[index]) <= FRAME_OVERHEAD:
        return None
    frame = bytearray(draft.frames[index])
    value = rng.choice((0x00, 0xFF, rng.randrange(256)))
    places = [rng.randrange(7, len(frame) - 1) for _ in range(rng.randint(1, 4))]
    for at in places:
        frame[at] = value
    original, draft.frames[index] = draft.frames[index], bytes(frame)
    return f"set bytes {places} of #{index} ({describe_frame(original)}) to {value:#04x}"


def insert_bytes(rng: random.Random, draft: _Draft) -> str | None:
    """Insert 1-16 random bytes into one frame's payload; usually fix the lengths around them."""
    index = _pick_frame(rng, draft)
    if index is None or len(draft.frames[index]) < FRAME_OVERHEAD:
        return None
    frame = draft.frames[index]
    at = rng.randint(7, len(frame) - 1)
    data = rng.randbytes(rng.randint(1, 16))
    fix = rng.random() < 0.7
    draft.frames[index] = splice(frame, at, 0, data, fix, fix and rng.random() < 0.5)
    return f"insert {data.hex()} at {at} of #{index} ({describe_frame(frame)}){' fixed' if fix else ''}"


def delete_bytes(rng: random.Random, draft: _Draft) -> str | None:
    """Delete 1-16 bytes of one frame's payload; usually fix the lengths around them."""
    index = _pick_frame(rng, draft)
    if index is None or len(draft.frames[index]) <= FRAME_OVERHEAD:
        return None
    frame = draft.frames[index]
    at = rng.randrange(7, len(frame) - 1)
    count = min(rng.randint(1, 16), len(frame) - 1 - at)
    fix = rng.random() < 0.7
    draft.frames[index] = splice(frame, at, count, b"", fix, fix and rng.random() < 0.5)
    return f"delete {count} bytes at {at} of #{index} ({describe_frame(frame)}){' fixed' if fix else ''}"


def _edge_values(rng: random.Random, current: int, width: int) -> int:
    top = 2 ** (8 * width) - 1
    return rng.choice((0, 1, top, top // 2, top // 2 + 1, current + 1, current - 1, current * 2, current + 100)) % (
        top + 1
    )


def set_length(rng: random.Random, draft: _Draft) -> str | None:
    """Set a length field to an edge value: frame size, a string or table length, a body size."""
    index = _pick_frame(rng, draft)
    if index is None or len(draft.frames[index]) < 7:
        return None
    frame = draft.frames[index]
    fields: list[tuple[int, int, str]] = [(3, 4, "frame size")]
    if len(frame) > FRAME_OVERHEAD:
        for span in _tables(frame):
            fields.append((span.length_at, 4, "table length"))
            fields.extend((at, width, "length in table") for at, width in span.lengths)
        fields.extend((at, 1, "shortstr length") for at in shortstr_offsets(frame[7:-1], 7)[:64])
        if frame[0] == FRAME_HEADER and len(frame) >= 22:
            fields.append((11, 8, "body size"))
    at, width, what = rng.choice(fields)
    current = int.from_bytes(frame[at : at + width], "big")
    value = _edge_values(rng, current, width)
    draft.frames[index] = frame[:at] + value.to_bytes(width, "big") + frame[at + width :]
    return f"{what} at {at} of #{index} ({describe_frame(frame)}): {current} -> {value}"


def change_tag(rng: random.Random, draft: _Draft) -> str | None:
    """Change the type tag of one field-table value (valid tags and invalid ones)."""
    index = _pick_frame(rng, draft, lambda frame: any(span.tags for span in _tables(frame)))
    if index is None:
        return None
    frame = draft.frames[index]
    tags = [at for span in _tables(frame) for at in span.tags]
    at = rng.choice(tags)
    tag = TAGS[rng.randrange(len(TAGS))]
    draft.frames[index] = frame[:at] + bytes((tag,)) + frame[at + 1 :]
    return f"tag at {at} of #{index} ({describe_frame(frame)}): {chr(frame[at])!r} -> {chr(tag)!r}"


def _add_headers_table(frame: bytes, entry: bytes) -> bytes | None:
    """A content header frame with a ``headers`` table holding just ``entry`` (None: has one already)."""
    if len(frame) < 22:
        return None
    flags = struct.unpack_from(">H", frame, 19)[0]
    if flags & 0x2000 or flags & 0x0001:
        return None
    at = 21
    for bit in (0x8000, 0x4000):  # content-type, content-encoding: the shortstrs before headers
        if flags & bit:
            if at >= len(frame) - 1:
                return None
            at += 1 + frame[at]
    if at > len(frame) - 1:
        return None
    table = struct.pack(">I", len(entry)) + entry
    grown = splice(frame, at, 0, table, True, False)
    return grown[:19] + struct.pack(">H", flags | 0x2000) + grown[21:]


def nest_deep(rng: random.Random, draft: _Draft) -> str | None:
    """Add a value nesting tables (or arrays) hundreds or thousands deep to a table; fix every length."""
    depth = rng.choice(NEST_DEPTHS)
    array = rng.random() < 0.3
    value = nested(depth, array)
    index = _pick_frame(rng, draft, lambda frame: bool(_tables(frame)))
    if index is not None and rng.random() < 0.8:
        frame = draft.frames[index]
        span = rng.choice(_tables(frame))
        entry = value if span.array else table_entry(b"deep", value[:1], value[1:])
        draft.frames[index] = splice(frame, span.end, 0, entry, True, True)
        kind = "arrays" if array else "tables"
        return f"nest {kind} {depth} deep in table at {span.length_at} of #{index} ({describe_frame(frame)})"
    index = _pick_frame(rng, draft, lambda frame: frame[:1] == bytes((FRAME_HEADER,)))
    if index is None:
        return None
    grown = _add_headers_table(draft.frames[index], table_entry(b"deep", value[:1], value[1:]))
    if grown is None:
        return None
    draft.frames[index] = grown
    return f"nest {'arrays' if array else 'tables'} {depth} deep in new headers of #{index} (content header)"


def empty_body(rng: random.Random, draft: _Draft) -> str | None:
    """Insert an empty or oversized content body frame after a content header."""
    index = _pick_frame(rng, draft, lambda frame: frame[:1] == bytes((FRAME_HEADER,)))
    if index is None:
        return None
    channel = struct.unpack_from(">H", draft.frames[index], 1)[0]
    size = rng.choice((0, 1, 4096))
    body = struct.pack(">BHI", FRAME_BODY, channel, size) + rng.randbytes(size) + b"\xce"
    draft.frames.insert(index + 1, body)
    return f"body frame of {size} bytes after #{index}"


#: Every mutation with its weight: frame-level and byte-level about equally, the table-aware
#: ones (tags, nesting) a little more than their share because the header codec is under repair.
MUTATIONS: tuple[tuple[Callable[[random.Random, _Draft], str | None], int], ...] = (
    (drop_frame, 8),
    (duplicate_frame, 8),
    (swap_frames, 6),
    (foreign_frame, 6),
    (change_channel, 6),
    (truncate_session, 6),
    (replace_header, 1),
    (flip_bits, 10),
    (set_bytes, 8),
    (insert_bytes, 6),
    (delete_bytes, 6),
    (set_length, 10),
    (change_tag, 10),
    (nest_deep, 6),
    (empty_body, 3),
)


def make_case(sessions: list[Session], seed: int, number: int) -> Case:
    """Build case ``number`` of ``seed`` from the recorded ``sessions`` (always the same bytes)."""
    rng = random.Random(f"postroom-fuzz/{seed}/{number}")
    session = rng.choice(sessions)
    draft = _Draft(session, sessions)
    applied: list[str] = []
    if rng.random() >= UNMUTATED_SHARE:
        wanted = 1
        while wanted < MAX_MUTATIONS and rng.random() < 0.35:
            wanted += 1
        functions = [function for function, _weight in MUTATIONS]
        weights = [weight for _function, weight in MUTATIONS]
        attempts = 0
        while len(applied) < wanted and attempts < 4 * MAX_MUTATIONS:
            attempts += 1
            mutation = rng.choices(functions, weights)[0]
            done = mutation(rng, draft)
            if done is not None:
                applied.append(done)
    data = draft.header + b"".join(draft.frames)
    if len(data) > 1 and rng.random() < 0.4:
        cuts = sorted(set(rng.randrange(1, len(data)) for _ in range(rng.randint(1, 5))))
        bounds = [0, *cuts, len(data)]
        chunks = tuple(data[start:end] for start, end in pairwise(bounds))
    else:
        chunks = (data,)
    ending = rng.choices(ENDINGS, ENDING_WEIGHTS)[0]
    return Case(number, session.name, tuple(applied), chunks, ending)
