"""A connection's socket as the management API shows it: addresses, unsent bytes, and the
TLS session in the names RabbitMQ gives them (Erlang's ``ssl`` names)."""

from __future__ import annotations

from typing import Any, Protocol, cast

from twisted.internet.interfaces import IAddress, ISSLTransport
from twisted.internet.protocol import Protocol as TwistedProtocol

from postroom.broker.core.sockets import PLAIN_TCP, SocketDetails


class SocketTransport(Protocol):
    """What the shell calls on a connection's transport (TCP, or TLS over it): Twisted types a
    protocol's ``transport`` as ``ITransport``, which lists only part of these (the rest are
    ``ITCPTransport``'s, ``IConsumer``'s and ``IPushProducer``'s)."""

    def write(self, data: bytes) -> None: ...

    def loseConnection(self) -> None: ...

    def abortConnection(self) -> None: ...

    def getPeer(self) -> IAddress: ...

    def getHost(self) -> IAddress: ...

    def registerProducer(self, producer: Any, streaming: bool) -> None: ...

    def unregisterProducer(self) -> None: ...

    def pauseProducing(self) -> None: ...

    def resumeProducing(self) -> None: ...


def socket_of(protocol: TwistedProtocol) -> SocketTransport:
    """``protocol``'s transport, once it is connected (:class:`SocketTransport`)."""
    transport = protocol.transport
    assert transport is not None, "the protocol is not connected"
    return cast(SocketTransport, transport)

#: OpenSSL's key exchange words in a TLS 1.2 suite name -> Erlang's ``key_exchange``.
_KEY_EXCHANGES = {
    "ECDHE-RSA": "ecdhe_rsa", "ECDHE-ECDSA": "ecdhe_ecdsa", "DHE-RSA": "dhe_rsa", "DHE-DSS": "dhe_dss",
    "ECDH-RSA": "ecdh_rsa", "ECDH-ECDSA": "ecdh_ecdsa", "ECDHE-PSK": "ecdhe_psk", "DHE-PSK": "dhe_psk",
    "RSA-PSK": "rsa_psk", "PSK": "psk", "SRP": "srp_anon",
}  # fmt: skip


def erlang_cipher_suite(name: str) -> tuple[str, str, str]:
    """``(key_exchange, cipher, mac)`` of an OpenSSL cipher suite name, as Erlang's
    ``ssl:connection_information`` names them (``TLS_AES_256_GCM_SHA384`` is
    ``any``, ``aes_256_gcm``, ``aead``; ``ECDHE-RSA-AES128-SHA256`` is ``ecdhe_rsa``,
    ``aes_128_cbc``, ``sha256``)."""
    if name.startswith("TLS_"):  # TLS 1.3: the key exchange is not part of the suite
        words = name[4:].split("_")
        if words[0] == "CHACHA20":
            return "any", "chacha20_poly1305", "aead"
        cipher = "_".join(word.lower() for word in words[:-1])  # AES_256_GCM
        return "any", cipher, "aead"
    key_exchange = "rsa"
    for prefix in sorted(_KEY_EXCHANGES, key=len, reverse=True):
        if name.startswith(prefix + "-"):
            key_exchange, name = _KEY_EXCHANGES[prefix], name[len(prefix) + 1 :]
            break
    words = name.split("-")
    if words[0] == "CHACHA20":
        return key_exchange, "chacha20_poly1305", "aead"
    algorithm = words[0]  # AES256, AES128, DES-CBC3, CAMELLIA256
    bits = "".join(c for c in algorithm if c.isdigit())
    family = algorithm.rstrip("0123456789").lower()
    if family == "des" and words[1:2] == ["CBC3"]:
        return key_exchange, "3des_ede_cbc", _mac(words[2:])
    mode = words[1].lower() if len(words) > 1 and words[1] in ("GCM", "CCM", "CBC") else "cbc"
    cipher = f"{family}_{bits}_{mode}" if bits else f"{family}_{mode}"
    return key_exchange, cipher, "aead" if mode in ("gcm", "ccm") else _mac(words[1:])


def _mac(words: list[str]) -> str:
    mac = words[-1].lower() if words else "sha"
    return mac if mac.startswith(("sha", "md5")) else "sha"


def rdn_string(name: Any) -> str:
    """A certificate's issuer or subject (``cryptography``'s ``Name``) as RabbitMQ writes it:
    RFC 4514, the last attribute first, values escaped as its ``rabbit_cert_info`` does."""
    from cryptography.x509.oid import NameOID

    short = {
        NameOID.SURNAME: "SN", NameOID.GIVEN_NAME: "GIVENNAME", NameOID.INITIALS: "INITIALS",
        NameOID.GENERATION_QUALIFIER: "GENERATIONQUALIFIER", NameOID.COMMON_NAME: "CN",
        NameOID.LOCALITY_NAME: "L", NameOID.STATE_OR_PROVINCE_NAME: "ST", NameOID.ORGANIZATION_NAME: "O",
        NameOID.ORGANIZATIONAL_UNIT_NAME: "OU", NameOID.TITLE: "TITLE", NameOID.COUNTRY_NAME: "C",
        NameOID.SERIAL_NUMBER: "SERIALNUMBER", NameOID.PSEUDONYM: "PSEUDONYM", NameOID.DOMAIN_COMPONENT: "DC",
        NameOID.EMAIL_ADDRESS: "EMAILADDRESS", NameOID.STREET_ADDRESS: "STREET", NameOID.USER_ID: "UID",
    }  # fmt: skip
    parts = []
    for rdn in reversed(list(name.rdns)):
        parts.append(
            "+".join(
                f"{short.get(attribute.oid, attribute.oid.dotted_string)}={_escape(str(attribute.value))}"
                for attribute in rdn
            )
        )
    return ",".join(parts)


def _escape(value: str) -> str:
    out = []
    raw = value.encode()
    for index, byte in enumerate(raw):
        char = chr(byte)
        if index == 0 and char in " #":
            out.append("\\" + char)
        elif index == len(raw) - 1 and char == " ":
            out.append("\\ ")
        elif char in '"+,;<>\\':
            out.append("\\" + char)
        elif byte < 32 or byte >= 126:
            out.append(f"\\{byte:02X}")
        else:
            out.append(char)
    return "".join(out)


def _asn1_time(moment: Any) -> str:
    """A validity bound as RabbitMQ writes it: a UTCTime (years 1950 to 2049) as a date and
    time, a GeneralizedTime as Erlang prints the term it has for it."""
    if 1950 <= moment.year <= 2049:
        return str(moment.strftime("%Y-%m-%dT%H:%M:%SZ"))
    return f'{{generalTime,"{moment.strftime("%Y%m%d%H%M%S")}Z"}}'


def tls_details(transport: Any) -> dict[str, Any]:
    """The ``ssl_*`` and ``peer_cert_*`` fields of a TLS transport's session, as RabbitMQ
    shows them (``tlsv1.3``, Erlang's suite names; the client's certificate, if it sent one)."""
    handle = transport.getHandle()
    protocol = handle.get_protocol_version_name()  # "TLSv1.3"
    key_exchange, cipher, mac = erlang_cipher_suite(handle.get_cipher_name() or "")
    details: dict[str, Any] = {
        "ssl_protocol": protocol.lower() if protocol.startswith("TLS") else protocol,
        "ssl_key_exchange": key_exchange,
        "ssl_cipher": cipher,
        "ssl_hash": mac,
        "peer_cert_issuer": None,
        "peer_cert_subject": None,
        "peer_cert_validity": None,
    }
    certificate = transport.getPeerCertificate()
    if certificate is not None:
        certificate = certificate.to_cryptography()
        details["peer_cert_issuer"] = rdn_string(certificate.issuer)
        details["peer_cert_subject"] = rdn_string(certificate.subject)
        validity = (certificate.not_valid_before_utc, certificate.not_valid_after_utc)
        details["peer_cert_validity"] = f"{_asn1_time(validity[0])} - {_asn1_time(validity[1])}"
    return details


def _pending(transport: Any) -> int:
    """Bytes a transport holds unsent (under TLS, those of the TCP transport beneath it too)."""
    pending = 0
    while transport is not None:
        buffer = getattr(transport, "dataBuffer", None)
        if buffer is not None:
            pending += len(buffer) - getattr(transport, "offset", 0) + getattr(transport, "_tempDataLen", 0)
        transport = getattr(transport, "transport", None)
    return pending


def socket_details(transport: Any) -> SocketDetails:
    """What the management API shows of the socket under ``transport``."""
    local, peer = transport.getHost(), transport.getPeer()
    tls = ISSLTransport.providedBy(transport)
    return SocketDetails(
        host=getattr(local, "host", ""),
        port=getattr(local, "port", 0),
        peer_host=getattr(peer, "host", ""),
        peer_port=getattr(peer, "port", 0),
        pending=lambda: _pending(transport),
        tls=(lambda: tls_details(transport)) if tls else None,
    )


__all__ = ["PLAIN_TCP", "socket_details", "tls_details", "erlang_cipher_suite", "rdn_string"]
