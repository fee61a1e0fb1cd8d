"""The throw-away PKI: identities land where the apiserver's x509 authenticator reads them, and
the certificates really complete a mutually authenticated TLS handshake on loopback."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kubeseer.devcluster import pki


def test_client_certificate_puts_user_in_cn_and_groups_in_o():
    ca = pki.Authority()
    pair = ca.issue_client(pki.Identity("alice", ("team-a", "system:masters")))
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    orgs = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [a.value for a in cn] == ["alice"]
    assert [a.value for a in orgs] == ["team-a", "system:masters"]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_service_account_identity_matches_what_the_apiserver_gives_a_token():
    identity = pki.service_account_identity("kubeseer-system", "kubeseer-operator")
    assert identity.user == "system:serviceaccount:kubeseer-system:kubeseer-operator"
    assert identity.groups == ("system:serviceaccounts", "system:serviceaccounts:kubeseer-system")


def test_issued_certificates_are_signed_by_the_ca_and_match_their_keys():
    ca = pki.Authority()
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    pair = ca.issue_server("apiserver", ips=("127.0.0.1",), dns=("localhost",))
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    cert.verify_directly_issued_by(ca_cert)
    key = serialization.load_pem_private_key(pair.key_pem, password=None)
    assert key.public_key() == cert.public_key()
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]


def test_signing_key_public_half_matches_private_half():
    key = pki.service_account_signing_key()
    private = serialization.load_pem_private_key(key.private_pem, password=None)
    public = serialization.load_pem_public_key(key.public_pem)
    assert private.public_key() == public


def test_serving_and_client_certificates_complete_mutual_tls_on_loopback(tmp_path: Path):
    ca = pki.Authority()
    server_pair = ca.issue_server("apiserver", ips=("127.0.0.1",))
    client_pair = ca.issue_client(pki.Identity("kubeseer-admin", ("system:masters",)))
    files = {
        "ca.crt": ca.cert_pem,
        "server.crt": server_pair.cert_pem,
        "server.key": server_pair.key_pem,
        "client.crt": client_pair.cert_pem,
        "client.key": client_pair.key_pem,
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=tmp_path / "ca.crt")
    server_ctx.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(cafile=tmp_path / "ca.crt")
    client_ctx.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")

    seen: list[object] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                seen.append(tls.getpeercert()["subject"])
                tls.sendall(b"ok")

        thread = threading.Thread(target=serve)
        thread.start()
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            client_ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            assert tls.recv(2) == b"ok"
        thread.join(timeout=5)
    assert seen == [
        ((("organizationName", "system:masters"),), (("commonName", "kubeseer-admin"),))
    ]
