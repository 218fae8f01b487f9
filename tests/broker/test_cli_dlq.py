"""``postroom dlq analyze`` hands the Spark job the data directory's stream and export."""

from __future__ import annotations

from pathlib import Path

import pytest

from postroom.broker.tools.cli import main


def test_analyze_reads_the_stream_and_the_export_of_the_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import postroom.spark.job
    seen: list[list[str]] = []
    monkeypatch.setattr(postroom.spark.job, "main", lambda argv: seen.append(list(argv)) or 0)
    (tmp_path / "deadletters-parquet").mkdir()
    status = main(
        ["dlq", "analyze", "--data-dir", str(tmp_path), "--out", "report", "--redrive-where", "reason = 'expired'"]
    )
    assert status == 0
    assert seen == [
        [
            "--out",
            "report",
            "--segments",
            str(tmp_path / "deadletters"),
            "--master",
            "local[*]",
            "--input",
            str(tmp_path / "deadletters-parquet"),
            "--redrive-where",
            "reason = 'expired'",
        ]
    ]


def test_analyze_without_an_export_reads_the_segments_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import postroom.spark.job
    seen: list[list[str]] = []
    monkeypatch.setattr(postroom.spark.job, "main", lambda argv: seen.append(list(argv)) or 0)
    assert main(["dlq", "analyze", "--data-dir", str(tmp_path), "--out", "r", "--master", "local[1]"]) == 0
    assert "--input" not in seen[0] and "--rows" not in seen[0]
    assert seen[0][seen[0].index("--master") + 1] == "local[1]"
    assert main(["dlq", "analyze", "--data-dir", str(tmp_path), "--out", "r", "--rows"]) == 0
    assert seen[1][-1] == "--rows"


def test_analyze_of_a_stream_reads_its_segments_and_its_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import postroom.spark.job
    seen: list[list[str]] = []
    monkeypatch.setattr(postroom.spark.job, "main", lambda argv: seen.append(list(argv)) or 0)
    (tmp_path / "streams-parquet" / "%2F" / "dead").mkdir(parents=True)
    command = ["dlq", "analyze", "--data-dir", str(tmp_path), "--out", "r", "--stream", "dead", "--from", "100"]
    assert main(command) == 0
    assert seen == [
        [
            "--out",
            "r",
            "--stream",
            "dead",
            "--vhost",
            "/",
            "--data-dir",
            str(tmp_path),
            "--from",
            "100",
            "--master",
            "local[*]",
            "--input",
            str(tmp_path / "streams-parquet" / "%2F" / "dead"),
        ]
    ]
    assert main([*command[:-1], "yesterday"]) == 2
    assert "'yesterday' is neither an offset nor an ISO 8601 time" in capsys.readouterr().err


def test_a_redrive_list_with_a_bad_line_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = tmp_path / "redrive.txt"
    ids.write_text("# pending\n12\nnot-an-id\n")
    assert main(["dlq", "redrive", "dlq", "--ids", str(ids), "--url", "amqp://guest:guest@127.0.0.1:1/"]) == 2
    assert f"{ids}:3: not a dead-letter id: 'not-an-id'" in capsys.readouterr().err


def test_the_export_timer_s_command_line_is_one_the_command_accepts() -> None:
    import shlex

    from postroom.broker.tools.cli import build_parser

    unit = (Path(__file__).resolve().parents[2] / "config" / "postroom-dlq-export.service").read_text()
    (line,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    program, *argv = shlex.split(line.removeprefix("ExecStart="))
    assert program.endswith("/postroom")
    args = build_parser().parse_args(argv)
    assert (args.dlq_command, args.jobs, args.delete_exported, args.retention) == ("export", 1, True, 90 * 86400)
