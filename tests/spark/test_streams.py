"""A stream that a dead-letter exchange feeds, read as dead-letter events: by the decoder alone,
by ``postroom dlq export --stream`` and by the Spark job's ``--stream``, from the segment files
of a real broker's stream."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")
pika = pytest.importorskip("pika")

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from postroom.broker.tools.fuzzing import sub_entry_batch  # noqa: E402
from postroom.broker.wal.chunks import BATCHED, RAW, pack_raw_entries, pack_tracking  # noqa: E402
from postroom.broker.wal.files import DirectoryStorage  # noqa: E402
from postroom.broker.wal.streamlog import StreamLog  # noqa: E402
from postroom.broker.wire.codec import shortstr  # noqa: E402
from postroom.broker.wire.table import encode_table  # noqa: E402
from postroom.spark.job import run  # noqa: E402
from postroom.spark.schema import ARROW_SCHEMA  # noqa: E402
from postroom.spark.streams import Selection, parse_bound, stream_file_batches, stream_segments  # noqa: E402
from tests.spark.test_end_to_end import ROOT, count, serve, wait_until  # noqa: E402

pytestmark = [pytest.mark.spark]


def header(headers: dict[str, Any]) -> bytes:
    """A content header with these headers and a message-id (in their property order)."""
    flags = 0x2000 | 0x0080
    prefix = (60).to_bytes(2, "big") + b"\0\0" + (3).to_bytes(8, "big") + flags.to_bytes(2, "big")
    return prefix + encode_table(headers) + shortstr("m-1")


def death(queue: str, reason: str) -> dict[str, Any]:
    return {"queue": queue, "reason": reason, "exchange": "", "count": 1, "routing-keys": [queue]}


def test_each_message_of_a_stream_is_a_dead_letter_event_of_its_latest_death(tmp_path: Path) -> None:
    log = StreamLog(DirectoryStorage(str(tmp_path)), 1 << 20)
    log.open()
    log.append([(b"dlx", b"work", header({"x-death": [death("work", "rejected")], "tenant": "acme"}), b"one")], 100.0)
    log.append(
        [
            (b"dlx", b"work", header({"x-death": [death("work", "expired"), death("first", "maxlen")]}), b"two"),
            (b"dlx", b"work", header({}), b"never died"),
        ],
        200.0,
    )
    number, path = 1, str(tmp_path / "00000000000000000001.wal")
    everything = pa.Table.from_batches(list(stream_file_batches(path, number, Selection("/", "dead"))), ARROW_SCHEMA)
    rows = everything.to_pylist()
    assert [(r["dead_letter_id"], r["queue"], r["reason"], r["kind"]) for r in rows] == [
        (0, "work", "rejected", "dead_lettered"),
        (1, "work", "expired", "dead_lettered"),
        (2, "", "", "dead_lettered"),
    ]
    first = rows[0]
    assert (first["dead_letter_exchange"], first["dead_letter_queues"], first["message_id"]) == ("dlx", ["dead"], "m-1")
    assert dict(first["headers"]) == {"tenant": "acme"} and first["body_preview"] == b"one"
    assert [d["reason"] for d in rows[1]["deaths"]] == ["expired", "maxlen"]
    assert first["time"].timestamp() == 100.0
    later = Selection("/", "dead").bounded("1", None)
    assert [r["dead_letter_id"] for r in _rows(path, number, later)] == [1, 2]
    by_time = Selection("/", "dead").bounded(None, "1970-01-01T00:02:30")
    assert [r["dead_letter_id"] for r in _rows(path, number, by_time)] == [0]
    with pytest.raises(ValueError):
        parse_bound("yesterday")


def _rows(path: str, number: int, selection: Selection) -> list[dict[str, Any]]:
    return pa.Table.from_batches(list(stream_file_batches(path, number, selection)), ARROW_SCHEMA).to_pylist()


def dead_letter_into_a_stream(port: int) -> None:
    """3 rejected, 2 expired and 1 dropped by a length limit, dead-lettered into stream ``dead``."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
    channel = connection.channel()
    channel.exchange_declare("dlx.s", "fanout", durable=True)
    channel.queue_declare("dead", durable=True, arguments={"x-queue-type": "stream"})
    channel.queue_bind("dead", "dlx.s")
    channel.queue_declare("work.s", durable=True, arguments={"x-dead-letter-exchange": "dlx.s", "x-max-length": 2})
    channel.confirm_delivery()
    for n in range(3):
        channel.basic_publish("", "work.s", b"reject %d" % n, pika.BasicProperties(headers={"tenant": "acme"}))
        method, _properties, _body = channel.basic_get("work.s")
        channel.basic_reject(method.delivery_tag, requeue=False)
    for n in range(2):
        channel.basic_publish("", "work.s", b"late %d" % n, pika.BasicProperties(expiration="50"))
    wait_until(lambda: count(channel, "work.s") == 0)
    for n in range(3):
        channel.basic_publish("", "work.s", b"full %d" % n)
    wait_until(lambda: count(channel, "dead") == 6)
    connection.close()


def test_a_dead_letter_stream_is_exported_and_analysed_as_dead_letters(spark: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serve(data) as port:
        dead_letter_into_a_stream(port)
    assert len(stream_segments(str(data), "/", "dead")) == 1
    expected = {"total": 6, "pending": 6, "by_reason": {"expired": 2, "maxlen": 1, "rejected": 3}}
    expected |= {"by_queue": {"work.s": 6}, "by_dlq": {"dead": 6}, "corrupt_records": 0}

    def job(out: str, **options: Any) -> dict[str, Any]:
        args = argparse.Namespace(
            input=options.get("input", []),
            segments=None,
            stream="dead",
            data_dir=str(data),
            vhost="/",
            start=options.get("start"),
            stop=None,
            out=str(tmp_path / out),
            master=None,
            redrive_where=None,
            redrive_all=False,
            rows=False,
        )
        return run(spark, args, say=lambda _message: None)

    summary = job("raw")
    assert {key: summary[key] for key in expected} == expected
    assert job("from", start="3")["by_reason"] == {"expired": 2, "maxlen": 1}

    exported = subprocess.run(
        [
            sys.executable,
            "-m",
            "postroom.broker.tools.cli",
            "dlq",
            "export",
            "--data-dir",
            str(data),
            "--stream",
            "dead",
        ]
        + ["--include-last"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert exported.returncode == 0, exported.stderr
    assert "(6 event(s), 0 corrupt" in exported.stdout
    parquet = data / "streams-parquet" / "%2F" / "dead"
    table = pq.read_table(str(parquet))
    assert sorted(table.column("body_preview").to_pylist())[:2] == [b"full 0", b"late 0"]
    from_parquet = job("parquet", input=[str(parquet)])  # the exported segment is not read raw again
    assert {key: from_parquet[key] for key in expected} == expected


def test_messages_published_over_the_stream_protocol_are_read_in_their_amqp_0_9_1_form(tmp_path: Path) -> None:
    log = StreamLog(DirectoryStorage(str(tmp_path)), 1 << 20)
    log.open()
    message = b"\x00\x53\x73\xc0\x06\x01\xa1\x03m-9" + b"\x00\x53\x75\xa0\x04body"  # message-id, one data section
    log.append([(b"", b"", b"", message), (b"", b"", b"", b"not AMQP 1.0")], 300.0)
    # (and as they are kept now: a chunk of simple entries)
    log.write([log.stage_packed(pack_raw_entries([message, b"raw"]), 2, 301.0, raw=RAW)])
    # (and sub-entry batches: a compressed one's messages are for the stream protocol's clients)
    batches = sub_entry_batch([b"one", message]) + sub_entry_batch([b"gzipped"], 1) + pack_raw_entries([b"last"])
    log.write([log.stage_packed(batches, 4, 302.0, raw=BATCHED)])
    # (and with a named publisher's trailer after the messages, which is not one of them)
    tracking = pack_tracking([("app-1", 12)])
    log.write([log.stage_packed(pack_raw_entries([b"tracked"]), 1, 303.0, raw=RAW, trailer=tracking)])
    log.write([log.stage_packed(sub_entry_batch([b"in a batch"]), 1, 304.0, raw=BATCHED, trailer=tracking)])
    rows = _rows(str(tmp_path / "00000000000000000001.wal"), 1, Selection("/", "events"))
    assert [(r["dead_letter_id"], r["message_id"], r["body_preview"], r["dead_letter_exchange"]) for r in rows] == [
        (0, "m-9", b"body", ""),
        (1, None, b"not AMQP 1.0", ""),
        (2, "m-9", b"body", ""),
        (3, None, b"raw", ""),
        (4, None, b"one", ""),
        (5, "m-9", b"body", ""),
        (7, None, b"last", ""),
        (8, None, b"tracked", ""),
        (9, None, b"in a batch", ""),
    ]
