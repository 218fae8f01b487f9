"""What the operator reads holds no control character from a name: escaped, not passed on."""

from __future__ import annotations

import io

from postroom.broker.text import EscapingWriter, printable


def test_printable_escapes_every_control_character() -> None:
    assert printable("orders\x1b[2J\n\u202eevil\x7f") == "orders\\x1b[2J\\n\\u202eevil\\x7f"
    assert printable("заказы.eu") == "заказы.eu"


def test_the_writer_keeps_the_programs_line_breaks_and_escapes_the_rest() -> None:
    stream = io.StringIO()
    writer = EscapingWriter(stream)
    print("queue 'a\x1b]0;pwned\x07'\tready", file=writer)  # type: ignore[arg-type]
    assert stream.getvalue() == "queue 'a\\x1b]0;pwned\\x07'\tready\n"
    assert writer.stream is stream
