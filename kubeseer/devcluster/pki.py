"""A throw-away PKI for one local cluster: a CA, a serving certificate for 127.0.0.1, client
certificates whose subject is the Kubernetes identity, and the service-account signing key.

Client certificates are the apiserver's x509 authenticator input: the Common Name becomes the
user name and each Organization a group. That lets the operator's kubeconfig carry exactly the
identity a real in-cluster service account has (`system:serviceaccount:<ns>:<name>` in the
`system:serviceaccounts` groups), so the RBAC manifests written for production are tested
unchanged. ECDSA P-256 keys keep generation in the milliseconds, which matters for the 30 s
start budget.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=30)
# Certificates start an hour in the past so that small clock differences never reject them.
BACKDATE = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM (PKCS#8) private key."""

    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class Identity:
    """A Kubernetes user as a client certificate presents it."""

    user: str
    groups: tuple[str, ...] = ()


def service_account_identity(namespace: str, name: str) -> Identity:
    """The user name and groups the apiserver gives a service account's token."""
    return Identity(
        user=f"system:serviceaccount:{namespace}:{name}",
        groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}"),
    )


class Authority:
    """A self-signed CA that issues the cluster's serving and client certificates."""

    def __init__(self, common_name: str = "kubeseer-devcluster-ca") -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate, to be trusted by clients and by the apiserver for client auth."""
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def issue_server(
        self, common_name: str, *, ips: Sequence[str] = ("127.0.0.1",), dns: Sequence[str] = ()
    ) -> KeyPair:
        """A serving certificate valid for the given loopback addresses and names."""
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        return self._issue(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]),
            ExtendedKeyUsageOID.SERVER_AUTH,
            x509.SubjectAlternativeName(names),
        )

    def issue_client(self, identity: Identity) -> KeyPair:
        """A client certificate that authenticates as `identity` (CN = user, O = groups)."""
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in identity.groups]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, identity.user))
        return self._issue(x509.Name(attributes), ExtendedKeyUsageOID.CLIENT_AUTH, None)

    def _issue(
        self,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        san: x509.SubjectAlternativeName | None,
    ) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        if san is not None:
            builder = builder.add_extension(san, critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _private_pem(key))


@dataclass(frozen=True)
class SigningKey:
    """The service-account token signing key (private for the apiserver, public to verify)."""

    private_pem: bytes
    public_pem: bytes


def service_account_signing_key() -> SigningKey:
    """A fresh ES256 key for `--service-account-signing-key-file` / `--service-account-key-file`."""
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return SigningKey(_private_pem(key), public)


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
