"""Text for people: names and reasons from clients, made safe to print.

A queue, vhost or user name, a reply text or a header value may hold any character, escape
sequences included; printed raw to a terminal or a log they could rewrite what the operator
sees (move the cursor, clear the screen, forge a log line). Every human-readable output
passes such text through :func:`printable`, or is written through :class:`EscapingWriter`.
"""

from __future__ import annotations

import re
from typing import Any, TextIO

__all__ = ["EscapingWriter", "printable"]

#: C0 and C1 controls, DEL, the line and paragraph separators and the bidirectional overrides.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
#: The same, but for the line breaks and tabs that output is made of.
_CONTROL_BUT_LAYOUT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    return ascii(match.group(0))[1:-1]


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\x1b``, ``\\n``, ``\\u202e``)."""
    return _CONTROL.sub(_escaped, text)


class EscapingWriter:
    """A text stream that writes to ``stream`` with every control character escaped except
    line breaks and tabs (which only the program's own text holds: names are put through
    :func:`printable` where a line break would mislead).

    :ivar stream: the stream written to, for output that moves the cursor on purpose (a
        progress line's carriage return)
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(_CONTROL_BUT_LAYOUT.sub(_escaped, text))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding ...
        return getattr(self.stream, name)
