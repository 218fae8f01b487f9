"""``tls:`` and ``auth_mechanisms:`` in the configuration: each TLS misconfiguration is
reported by ``postroom config check`` with its key path, its line and the file at fault,
before anything listens."""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from postroom.config.loader import loads
from postroom.config.values import ConfigError


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("tls-config")
    ca = trustme.CA()
    other = trustme.CA()
    now = datetime.datetime.now(datetime.timezone.utc)
    certificates = {
        "server": ca.issue_cert("localhost"),
        "other": other.issue_cert("localhost"),
        "expired": ca.issue_cert(
            "localhost", not_before=now - datetime.timedelta(days=30), not_after=now - datetime.timedelta(days=1)
        ),
        "future": ca.issue_cert(
            "localhost", not_before=now + datetime.timedelta(days=1), not_after=now + datetime.timedelta(days=30)
        ),
    }
    paths = {}
    for name, issued in certificates.items():
        issued.cert_chain_pems[0].write_to_path(directory / f"{name}.crt")
        issued.private_key_pem.write_to_path(directory / f"{name}.key")
        paths[f"{name}.crt"] = str(directory / f"{name}.crt")
        paths[f"{name}.key"] = str(directory / f"{name}.key")
    ca.cert_pem.write_to_path(directory / "ca.pem")
    paths["ca"] = str(directory / "ca.pem")
    (directory / "garbage.pem").write_text("not a certificate\n")
    paths["garbage"] = str(directory / "garbage.pem")
    key = serialization.load_pem_private_key(Path(paths["server.key"]).read_bytes(), password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"secret")
    )
    (directory / "encrypted.key").write_bytes(encrypted)
    paths["encrypted.key"] = str(directory / "encrypted.key")
    paths["missing"] = str(directory / "missing.pem")
    paths["dir"] = str(directory)
    return paths


def document(certificate: str, key: str, extra: str = "", ca: str | None = None) -> str:
    return (
        "listen: {amqps: 'tcp:5671:interface=127.0.0.1'}\n"
        "tls:\n"
        f"  certificate: {certificate}\n"
        f"  key: {key}\n" + (f"  ca: {ca}\n" if ca else "") + extra
    )


def problems(text: str) -> list[tuple[int | None, str, str]]:
    with pytest.raises(ConfigError) as refused:
        loads(text, "broker.yaml")
    return [(problem.line, problem.key, problem.reason) for problem in refused.value.problems]


def test_a_good_tls_section_loads(files: dict[str, str]) -> None:
    config = loads(
        document(files["server.crt"], files["server.key"], "  verify: peer\n", ca=f"[{files['ca']}, {files['ca']}]"),
        "broker.yaml",
    )

    assert config.tls is not None
    assert config.tls.ca == (files["ca"], files["ca"])
    assert config.tls.verify == "peer"
    assert config.listen.amqps == "tcp:5671:interface=127.0.0.1"


@pytest.mark.parametrize(
    ("certificate", "key", "where", "reason"),
    [
        ("missing", "server.key", "tls.certificate", "{missing}: no such file"),
        ("dir", "server.key", "tls.certificate", "{dir}: is a directory, not a file"),
        ("garbage", "server.key", "tls.certificate", "{garbage}: not a PEM certificate file"),
        ("server.crt", "missing", "tls.key", "{missing}: no such file"),
        ("server.crt", "garbage", "tls.key", "{garbage}: not a PEM private key"),
        (
            "server.crt",
            "encrypted.key",
            "tls.key",
            "{encrypted.key}: the key is encrypted; give the key without a passphrase",
        ),
        ("server.crt", "other.key", "tls.key", "{other.key}: the key does not match the certificate in {server.crt}"),
        ("expired.crt", "expired.key", "tls.certificate", "{expired.crt}: the certificate expired on "),
        ("future.crt", "future.key", "tls.certificate", "{future.crt}: the certificate is not valid before "),
    ],
    ids=[
        "missing",
        "directory",
        "not a certificate",
        "missing key",
        "not a key",
        "encrypted key",
        "mismatched key",
        "expired",
        "not yet valid",
    ],
)
def test_each_tls_file_problem_names_the_key_line_and_file(
    files: dict[str, str], certificate: str, key: str, where: str, reason: str
) -> None:
    found = problems(document(files[certificate], files[key]))

    line = 3 if where == "tls.certificate" else 4
    assert len(found) == 1, found
    assert found[0][:2] == (line, where)
    for name, path in files.items():
        reason = reason.replace(f"{{{name}}}", path)
    assert found[0][2].startswith(reason)


def test_a_ca_file_that_is_not_a_certificate_is_named_by_its_index(files: dict[str, str]) -> None:
    found = problems(document(files["server.crt"], files["server.key"], ca=f"[{files['ca']}, {files['garbage']}]"))

    assert found == [(5, "tls.ca[1]", f"{files['garbage']}: not a PEM certificate file")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("listen: {amqps: 'tcp:5671'}\n", [(1, "listen.amqps", "needs the tls: section (certificate and key)")]),
        (
            "listen: {amqp: 'ssl:5671:privateKey=key.pem'}\n",
            [(1, "listen.amqp", "ssl: endpoints are not taken: listen on tcp: and set the tls: section")],
        ),
        (
            "listen: {metrics: 'udp:9'}\n",
            [
                (
                    1,
                    "listen.metrics",
                    "must be a tcp:, tcp6: or unix: endpoint (e.g. tcp:5672:interface=::1), not 'udp:9'",
                )
            ],
        ),
        (
            "auth_mechanisms: [PLAIN, CRAM-MD5]\n",
            [(1, "auth_mechanisms", "unknown mechanism 'CRAM-MD5' (expected: AMQPLAIN, PLAIN, EXTERNAL)")],
        ),
        ("auth_mechanisms: []\n", [(1, "auth_mechanisms", "no mechanism left to log in with")]),
        (
            "auth_mechanisms: [PLAIN, EXTERNAL]\n",
            [
                (
                    1,
                    "auth_mechanisms",
                    "EXTERNAL takes the user from a verified client certificate: it needs tls: with verify: peer",
                )
            ],
        ),
        (
            "users: [{name: app}]\n",
            [
                (
                    1,
                    "users[0]",
                    "give password or password_hash (a user with neither logs in only with a client certificate, "
                    "which needs EXTERNAL in auth_mechanisms)",
                )
            ],
        ),
    ],
    ids=[
        "amqps without tls",
        "ssl endpoint",
        "unknown endpoint kind",
        "unknown mechanism",
        "no mechanism",
        "external without tls",
        "user without password",
    ],
)
def test_listener_and_mechanism_mistakes_are_refused(text: str, expected: list[tuple[int, str, str]]) -> None:
    assert problems(text) == expected


def test_verify_settings_that_cannot_work_are_refused(files: dict[str, str]) -> None:
    found = problems(
        document(files["server.crt"], files["server.key"], "  verify: peer\n  fail_if_no_peer_cert: true\n")
    )
    assert [(key, reason) for _line, key, reason in found] == [
        ("tls.verify", "peer needs the CA certificates to verify clients against (tls.ca)")
    ]
    found = problems(document(files["server.crt"], files["server.key"], "  fail_if_no_peer_cert: true\n"))
    assert [(key, reason) for _line, key, reason in found] == [
        ("tls.fail_if_no_peer_cert", "needs verify: peer (certificates are not asked for otherwise)")
    ]
    found = problems(f"tls: {{certificate: {files['server.crt']}, key: {files['server.key']}}}\n")
    assert [(key, reason) for _line, key, reason in found] == [
        (
            "tls",
            "no listener uses it: set listen.amqps, listen.stream_tls or listen.mqtt_tls, or http: true with a"
            " metrics or management listener",
        )
    ]


def test_config_check_reports_a_tls_problem_before_anything_starts(files: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text(document(files["server.crt"], files["other.key"]))

    result = subprocess.run(
        [sys.executable, "-m", "postroom.broker.tools.cli", "config", "check", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )

    assert result.returncode == 1
    assert f"{path}:4: tls.key: {files['other.key']}: the key does not match the certificate" in result.stderr
    assert "Traceback" not in result.stderr


def cluster_document(files: dict[str, str], certificate: str, key: str, ca: str | None) -> str:
    tls = f"certificate: {files[certificate]}, key: {files[key]}" + (f", ca: [{files[ca]}]" if ca else "")
    return f"cluster:\n  name: a\n  etcd: [http://127.0.0.1:2379]\n  listen: 'tcp:5679'\n  tls: {{{tls}}}\n"


def test_the_cluster_links_take_a_certificate_a_key_and_the_nodes_ca(files: dict[str, str]) -> None:
    config = loads(cluster_document(files, "server.crt", "server.key", "ca"), "broker.yaml")

    assert config.cluster is not None and config.cluster.tls is not None
    tls = config.cluster.tls
    assert (tls.certificate, tls.key, tls.ca) == (files["server.crt"], files["server.key"], (files["ca"],))
    assert (tls.verify, tls.fail_if_no_peer_cert) == ("peer", True)
    assert config.tls is None  # (the clients' listeners are another matter)


def test_each_cluster_tls_problem_names_its_key_under_cluster(files: dict[str, str]) -> None:
    assert problems(cluster_document(files, "server.crt", "server.key", None)) == [
        (5, "cluster.tls", "missing required key 'ca'")
    ]
    found = problems(cluster_document(files, "expired.crt", "expired.key", "ca"))
    assert [(key, reason.split(":")[0]) for _line, key, reason in found] == [
        ("cluster.tls.certificate", files["expired.crt"])
    ]
    found = problems(cluster_document(files, "server.crt", "other.key", "garbage"))
    assert [key for _line, key, _reason in found] == ["cluster.tls.key"]
    found = problems(cluster_document(files, "server.crt", "server.key", "garbage"))
    assert [key for _line, key, _reason in found] == ["cluster.tls.ca[0]"]
