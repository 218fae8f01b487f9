"""The TLS settings as OpenSSL takes them: one server context, built and checked in one place.

``postroom config check`` and ``postroom serve`` both call :func:`server_context`, so a
missing file, a key that does not match its certificate or an expired certificate is
reported the same way, with the key path and the file, before anything listens.

The context speaks TLS 1.2 and 1.3 only. With ``verify: peer`` it asks each client for a
certificate and refuses one that no CA in ``ca`` vouches for; a client that presents none
is let in unless ``fail_if_no_peer_cert`` is set (RabbitMQ's ``verify_peer`` and
``fail_if_no_peer_cert``). Every CA in ``ca`` is trusted, so clients whose certificates come
from different CAs all get through.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from postroom.config.schema import TLSConfig


class TLSProblem(Exception):
    """A TLS setting cannot be used: :attr:`key` is its key path, the message says why."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(reason)
        self.key = key
        self.reason = reason


def _read(path: str, key: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise TLSProblem(key, f"{path}: no such file") from None
    except IsADirectoryError:
        raise TLSProblem(key, f"{path}: is a directory, not a file") from None
    except OSError as error:
        raise TLSProblem(key, f"{path}: cannot be read ({error.strerror})") from None


def _certificates(path: str, key: str) -> list:
    """Every certificate in the PEM file at ``path``; at least one."""
    from cryptography import x509

    data = _read(path, key)
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise TLSProblem(key, f"{path}: not a PEM certificate file") from None
    return certificates


def _check_dates(certificate, path: str, key: str, now: datetime.datetime) -> None:
    if certificate.not_valid_after_utc < now:
        expired = certificate.not_valid_after_utc
        raise TLSProblem(key, f"{path}: the certificate expired on {expired:%Y-%m-%d %H:%M} UTC")
    if certificate.not_valid_before_utc > now:
        raise TLSProblem(
            key, f"{path}: the certificate is not valid before {certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
        )


def _context(tls: TLSConfig, section: str, now: datetime.datetime | None):
    """A TLS 1.2+ context holding ``tls``'s certificate chain and key, trusting its CAs.

    :returns: the context and the CA certificates
    """
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from OpenSSL import SSL

    now = now or datetime.datetime.now(datetime.timezone.utc)
    chain = _certificates(tls.certificate, f"{section}.certificate")
    for certificate in chain:
        _check_dates(certificate, tls.certificate, f"{section}.certificate", now)
    key_data = _read(tls.key, f"{section}.key")
    try:
        private_key = serialization.load_pem_private_key(key_data, password=None)
    except TypeError:
        raise TLSProblem(
            f"{section}.key", f"{tls.key}: the key is encrypted; give the key without a passphrase"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise TLSProblem(f"{section}.key", f"{tls.key}: not a PEM private key") from None

    context = SSL.Context(SSL.TLS_METHOD)
    context.set_min_proto_version(SSL.TLS1_2_VERSION)
    context.set_options(SSL.OP_NO_COMPRESSION | SSL.OP_CIPHER_SERVER_PREFERENCE | SSL.OP_NO_RENEGOTIATION)
    context.use_certificate(chain[0])
    for intermediate in chain[1:]:
        context.add_extra_chain_cert(intermediate)
    try:
        context.use_privatekey(private_key)
        context.check_privatekey()
    except SSL.Error:
        raise TLSProblem(
            f"{section}.key", f"{tls.key}: the key does not match the certificate in {tls.certificate}"
        ) from None

    authorities = []
    for index, path in enumerate(tls.ca):
        key = f"{section}.ca[{index}]"
        for certificate in _certificates(path, key):
            _check_dates(certificate, path, key, now)
            authorities.append(certificate)
        context.load_verify_locations(path)
    return context, authorities


def server_context(tls: TLSConfig, now: datetime.datetime | None = None, section: str = "tls"):
    """An ``OpenSSL.SSL.Context`` for the listeners, with every file loaded and checked.

    :param now: the time certificates must be valid at (now by default)
    :param section: the configuration's key of ``tls``, which problems name
    :raises TLSProblem: a file is missing or unreadable, is not what it should be, the key
        does not match the certificate, or a certificate has expired or is not valid yet
    """
    from OpenSSL import SSL

    context, authorities = _context(tls, section, now)
    if tls.verify == "peer":
        # The names of the CAs go into the certificate request, so clients holding several
        # certificates present one these CAs signed.
        for certificate in authorities:
            context.add_client_ca(certificate)
        mode = SSL.VERIFY_PEER | (SSL.VERIFY_FAIL_IF_NO_PEER_CERT if tls.fail_if_no_peer_cert else 0)
        context.set_verify(mode, _verified)
    # Sessions are resumed only on the listener that issued them.
    context.set_session_id(b"postroom")
    return context


def client_context(tls: TLSConfig, section: str):
    """An ``OpenSSL.SSL.Context`` for connections this process makes: it presents ``tls``'s
    certificate and refuses a server whose certificate none of ``tls.ca`` signed (names are
    not checked: the CAs say who belongs).

    :raises TLSProblem: as :func:`server_context`
    """
    from OpenSSL import SSL

    context, _authorities = _context(tls, section, None)
    context.set_verify(SSL.VERIFY_PEER, _verified)
    return context


def _verified(connection, certificate, error_number: int, depth: int, ok: int) -> bool:
    """OpenSSL's verdict stands (a certificate no configured CA vouches for is refused)."""
    return bool(ok)
