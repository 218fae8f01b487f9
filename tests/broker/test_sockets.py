"""A connection's TLS session and certificate in the names RabbitMQ's management API gives them.

The whole of a session is compared with RabbitMQ's in
``tests/conformance/test_stream_tls_transcripts.py`` (one TLS 1.3 suite, one certificate);
these cover the suites and names a test PKI does not produce.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from postroom.broker.server.sockets import _asn1_time, erlang_cipher_suite, rdn_string


@pytest.mark.parametrize(
    ("suite", "expected"),
    [
        ("TLS_AES_256_GCM_SHA384", ("any", "aes_256_gcm", "aead")),
        ("TLS_AES_128_GCM_SHA256", ("any", "aes_128_gcm", "aead")),
        ("TLS_CHACHA20_POLY1305_SHA256", ("any", "chacha20_poly1305", "aead")),
        ("ECDHE-RSA-AES256-GCM-SHA384", ("ecdhe_rsa", "aes_256_gcm", "aead")),
        ("ECDHE-ECDSA-CHACHA20-POLY1305", ("ecdhe_ecdsa", "chacha20_poly1305", "aead")),
        ("ECDHE-RSA-AES128-SHA256", ("ecdhe_rsa", "aes_128_cbc", "sha256")),
        ("DHE-RSA-AES256-CCM", ("dhe_rsa", "aes_256_ccm", "aead")),
        ("AES256-SHA", ("rsa", "aes_256_cbc", "sha")),
        ("DES-CBC3-SHA", ("rsa", "3des_ede_cbc", "sha")),
    ],
)
def test_openssl_suite_names_become_erlangs(suite: str, expected: tuple[str, str, str]) -> None:
    assert erlang_cipher_suite(suite) == expected


def test_a_name_is_written_last_attribute_first_with_rabbitmqs_escapes() -> None:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "GB"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Acme, Inc."),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "#ops "),
            x509.NameAttribute(NameOID.COMMON_NAME, "Zoë"),
        ]
    )
    assert rdn_string(name) == "CN=Zo\\C3\\AB,OU=\\#ops\\ ,O=Acme\\, Inc.,C=GB"


def test_validity_bounds_after_2049_are_printed_as_erlang_terms() -> None:
    assert _asn1_time(datetime(2030, 5, 6, 7, 8, 9, tzinfo=timezone.utc)) == "2030-05-06T07:08:09Z"
    assert _asn1_time(datetime(3000, 1, 1, tzinfo=timezone.utc)) == '{generalTime,"30000101000000Z"}'
