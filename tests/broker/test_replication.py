"""Replication's sans-IO parts: the ops a leader's storages note, their encoding, a follower
applying them, and the copy that brings a follower's files to the leader's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from postroom.broker.cluster.replication import (
    Applier,
    Op,
    OpKind,
    Recorder,
    apply_ops,
    decode_ops,
    encode_ops,
    file_index,
    replicated_files,
    sync_ops,
)
from postroom.broker.wal.files import DirectoryStorage
from postroom.broker.wal.log import WriteAheadLog
from postroom.broker.wal.streamlog import StreamLog


def tree(root: Path) -> dict[str, bytes]:
    return {name: (root / name).read_bytes() for name in replicated_files(str(root))}


ops_strategy = st.lists(
    st.builds(
        Op,
        st.sampled_from(list(OpKind)),
        st.lists(
            st.text("abc0123456789.", min_size=1, max_size=8).filter(lambda part: part not in (".", "..")),
            min_size=1,
            max_size=3,
        ).map("/".join),
        st.integers(0, 2**63),
        st.binary(max_size=64),
    ),
    max_size=8,
)


@given(ops_strategy)
def test_ops_survive_encoding(ops: list[Op]) -> None:
    assert decode_ops(b"".join(encode_ops(ops))) == ops


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "a/../../b", "a//b", ""])
def test_a_path_outside_the_data_directory_is_refused(path: str) -> None:
    raw = b"".join(encode_ops([Op(OpKind.WRITE, path, 0, b"1")]))
    with pytest.raises(ValueError, match="leaves the data directory"):
        decode_ops(raw)


def test_a_cut_off_batch_is_refused() -> None:
    raw = b"".join(encode_ops([Op(OpKind.WRITE, "00000000000000000001.wal", 0, b"12345")]))
    with pytest.raises(ValueError, match="ends inside an op"):
        decode_ops(raw[:-1])


def test_what_a_log_writes_makes_the_same_files_on_a_follower(tmp_path: Path) -> None:
    leader, follower = tmp_path / "leader", tmp_path / "follower"
    leader.mkdir()
    recorder = Recorder(str(leader))
    storage = DirectoryStorage(leader, leader / "archive", recorder)
    log = WriteAheadLog(storage, segment_bytes=4096)
    log.open()
    for number in range(40):
        log.append(bytes([number]) * 300)
        if log.should_rotate():
            log.rotate(b"first")
    log.sync()
    storage.truncate(log.active, storage.size(log.active) - 100)
    log.retire(log.segments()[0])
    (leader / "streams" / "s").mkdir(parents=True)
    stream = StreamLog(DirectoryStorage(leader / "streams" / "s", recorder=recorder))
    stream.open()
    seq, ops = recorder.cut()
    assert seq == 1 and {op.kind for op in ops} == {OpKind.CREATE, OpKind.WRITE, OpKind.TRUNCATE, OpKind.RETIRE}
    apply_ops(str(follower), decode_ops(b"".join(encode_ops(ops))))
    assert tree(follower) == tree(leader)
    assert sorted(os.listdir(follower / "archive")) == sorted(os.listdir(leader / "archive"))
    assert recorder.cut() == (1, [])  # nothing noted since: no new number
    storage.close()


def test_applying_a_batch_twice_changes_nothing(tmp_path: Path) -> None:
    ops = [
        Op(OpKind.CREATE, "1.wal", 0, b"head"),
        Op(OpKind.WRITE, "1.wal", 4, b"body"),
        Op(OpKind.WRITE, "streams/s/1.wal", 0, b"chunk"),
        Op(OpKind.TRUNCATE, "1.wal", 6),
    ]
    applier = Applier(str(tmp_path))
    applier.apply(ops)
    once = {name: (tmp_path / name).read_bytes() for name in ("1.wal", "streams/s/1.wal")}
    applier.apply(ops)
    applier.sync()
    applier.close()
    assert once == {"1.wal": b"headbo", "streams/s/1.wal": b"chunk"}
    assert {name: (tmp_path / name).read_bytes() for name in once} == once


def test_a_write_past_the_end_of_a_file_is_refused(tmp_path: Path) -> None:
    applier = Applier(str(tmp_path))
    with pytest.raises(ValueError, match="past the end"):
        applier.apply([Op(OpKind.WRITE, "1.wal", 10, b"gap")])
    applier.close()


def test_remove_takes_a_whole_stream_directory(tmp_path: Path) -> None:
    apply_ops(str(tmp_path), [Op(OpKind.WRITE, "streams/a/b/1.wal", 0, b"x"), Op(OpKind.WRITE, "2.wal", 0, b"y")])
    apply_ops(str(tmp_path), [Op(OpKind.REMOVE, "streams/a"), Op(OpKind.RETIRE, "2.wal", 0)])
    assert not (tmp_path / "streams" / "a").exists()
    assert not (tmp_path / "2.wal").exists()


def test_the_copy_sends_only_what_a_follower_lacks(tmp_path: Path) -> None:
    leader, follower = tmp_path / "leader", tmp_path / "follower"
    (leader / "streams" / "s").mkdir(parents=True)
    (leader / "00000000000000000001.wal").write_bytes(b"a" * 5000)
    (leader / "00000000000000000002.wal").write_bytes(b"b" * 100)
    (leader / "streams" / "s" / "00000000000000000001.wal").write_bytes(b"s" * 10)
    (leader / "dead-letter-seal.key").write_bytes(b"k" * 32)
    (leader / "checkpoint").mkdir()
    (leader / "checkpoint" / "manifest").write_bytes(b"half written: no manifest.json")
    follower.mkdir()
    (follower / "00000000000000000001.wal").write_bytes(b"a" * 3000)  # a prefix: only the rest goes
    (follower / "00000000000000000002.wal").write_bytes(b"c" * 50)  # differs: all of it goes
    (follower / "00000000000000000000.wal").write_bytes(b"old")  # the leader has none: removed

    ops = list(sync_ops(str(leader), file_index(str(follower))))
    sent = {op.path: len(op.data) for op in ops if op.kind is OpKind.WRITE}
    assert sent == {
        "00000000000000000001.wal": 2000,
        "00000000000000000002.wal": 100,
        "streams/s/00000000000000000001.wal": 10,
        "dead-letter-seal.key": 32,
    }
    assert Op(OpKind.TRUNCATE, "00000000000000000002.wal", 0) in ops
    assert Op(OpKind.REMOVE, "00000000000000000000.wal") in ops
    apply_ops(str(follower), ops)
    assert tree(follower) == tree(leader)
    assert not (follower / "checkpoint").exists()
    # Nothing more to send, but that the follower has no checkpoint (the leader's is not whole).
    assert {op.kind for op in sync_ops(str(leader), file_index(str(follower)))} == {OpKind.REMOVE}


def test_an_empty_file_is_copied_too(tmp_path: Path) -> None:
    leader, follower = tmp_path / "leader", tmp_path / "follower"
    leader.mkdir()
    (leader / "00000000000000000001.wal").write_bytes(b"")
    apply_ops(str(follower), sync_ops(str(leader), {}))
    assert (follower / "00000000000000000001.wal").read_bytes() == b""


def test_a_follower_that_joins_gets_every_later_batch(tmp_path: Path) -> None:
    recorder = Recorder(str(tmp_path))
    recorder.wrote(str(tmp_path / "1.wal"), 0, b"x")
    assert recorder.mark() == 0  # noted, not cut: the next batch (1) carries it
    assert recorder.cut()[0] == 1
    assert recorder.mark() == 1


def test_a_checkpoint_reaches_a_follower_whole_and_replaces_its_last(tmp_path: Path) -> None:
    leader, follower = tmp_path / "leader", tmp_path / "follower"
    (leader / "checkpoint" / "q1").mkdir(parents=True)
    (leader / "checkpoint" / "manifest.json").write_bytes(b'{"v": 2}')
    (leader / "checkpoint" / "q1" / "head").write_bytes(b"records")
    (follower / "checkpoint").mkdir(parents=True)
    (follower / "checkpoint" / "manifest.json").write_bytes(b'{"v": 1}')
    (follower / "checkpoint" / "stale").write_bytes(b"from the last one")
    recorder = Recorder(str(leader))
    recorder.checkpointed(str(leader / "checkpoint"))
    _seq, ops = recorder.cut()
    assert ops[-1] == Op(OpKind.RENAME, "checkpoint.new", 0, b"checkpoint")
    apply_ops(str(follower), decode_ops(b"".join(encode_ops(ops))))
    assert sorted(os.listdir(follower)) == ["checkpoint"]
    assert (follower / "checkpoint" / "manifest.json").read_bytes() == b'{"v": 2}'
    assert (follower / "checkpoint" / "q1" / "head").read_bytes() == b"records"
    assert not (follower / "checkpoint" / "stale").exists()
    recorder.no_checkpoint(str(leader / "checkpoint"))
    apply_ops(str(follower), recorder.cut()[1])
    assert not (follower / "checkpoint").exists()


def test_the_copy_carries_the_checkpoint_and_none_when_there_is_none(tmp_path: Path) -> None:
    leader, follower = tmp_path / "leader", tmp_path / "follower"
    (leader / "checkpoint").mkdir(parents=True)
    (leader / "checkpoint" / "manifest.json").write_bytes(b"{}")
    (follower / "checkpoint").mkdir(parents=True)
    (follower / "checkpoint" / "manifest.json").write_bytes(b"old")
    apply_ops(str(follower), sync_ops(str(leader), file_index(str(follower))))
    assert (follower / "checkpoint" / "manifest.json").read_bytes() == b"{}"
    shutil.rmtree(leader / "checkpoint")
    apply_ops(str(follower), sync_ops(str(leader), file_index(str(follower))))
    assert not (follower / "checkpoint").exists()


def test_a_checkpoint_that_cannot_be_read_back_makes_the_followers_drop_theirs(tmp_path: Path) -> None:
    leader = tmp_path / "leader"
    (leader / "checkpoint" / "q1").mkdir(parents=True)
    (leader / "checkpoint" / "manifest.json").write_bytes(b"{}")
    (leader / "checkpoint" / "q1" / "head").symlink_to(tmp_path / "gone")  # read back: ENOENT
    recorder = Recorder(str(leader))
    recorder.checkpointed(str(leader / "checkpoint"))
    assert [(op.kind, op.path) for op in recorder.cut()[1]] == [
        (OpKind.REMOVE, "checkpoint"),
        (OpKind.REMOVE, "checkpoint.new"),
        (OpKind.REMOVE, "checkpoint.old"),
    ]
