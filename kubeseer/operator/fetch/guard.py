"""The SSRF guard: which hosts and addresses a model URL may reach.

A DLJob names its model by URL and the operator fetches it from inside the cluster, so a URL is
untrusted input that can point at the cloud metadata service, the API server or any Service:

1. the URL is parsed and its host checked: names under `.svc`/`.cluster.local`, `localhost` and
   single-label names (which resolve through the cluster's search domains) are refused;
2. the host is resolved once and every address it resolves to must be globally routable and
   outside the cluster CIDRs the admin configured (no loopback, link-local, RFC 1918, 100.64/10,
   unique-local or IPv4-mapped versions of those);
3. the caller connects to the address returned here (`transfer` pins it), so a second DNS
   answer cannot swap in an internal address.

Hosts the admin allow-lists skip steps 1-2, not 3.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Sequence

from kubeseer.operator.fetch import errors, policy

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_INTERNAL_SUFFIXES = (".svc", ".cluster.local", ".localhost", ".internal")


def split(url: str) -> urllib.parse.SplitResult:
    """`url` parsed, refusing malformed ports, http(s) URLs without a host, and credentials."""
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises on a malformed port
    except ValueError as e:
        raise errors.BadURLError(f"malformed URL {url!r}: {e}", url=url) from e
    if parts.scheme in ("http", "https"):
        if not parts.hostname:
            raise errors.BadURLError(f"URL {url!r} has no host", url=url)
        if parts.username is not None or parts.password is not None:
            raise errors.BadURLError(
                f"URL {url!r} carries credentials; use an s3:// URL with a Secret instead", url=url
            )
    return parts


def guarded_address(
    host: str, port: int, rules: policy.FetchPolicy, *, trusted: bool, url: str
) -> str:
    """Resolve `host` once and return the address to connect to, refusing internal targets."""
    literal = _literal_address(host)
    if not trusted and literal is None:
        lowered = host.lower().rstrip(".")
        if lowered == "localhost" or lowered.endswith(_INTERNAL_SUFFIXES):
            raise errors.ForbiddenAddressError(
                f"{host!r} is a cluster-internal or local name; ask the admin to allow-list it",
                url=url,
            )
        if "." not in lowered:
            raise errors.ForbiddenAddressError(
                f"{host!r} is a single-label name, which resolves through the cluster's search "
                "domains; use a fully qualified public name or ask the admin to allow-list it",
                url=url,
            )
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            addresses = list(rules.resolver(host, port))
        except (OSError, UnicodeError) as e:
            raise errors.UnreachableError(f"cannot resolve {host!r}: {describe(e)}", url=url) from e
        if not addresses:
            raise errors.UnreachableError(f"{host!r} resolves to no address", url=url)
    if not trusted:
        for text in addresses:
            reason = address_refusal(ipaddress.ip_address(text), rules.forbidden_networks)
            if reason is not None:
                raise errors.ForbiddenAddressError(
                    f"{host!r} resolves to {text}, {reason}; ask the admin to allow-list the "
                    "host if this is intended",
                    url=url,
                )
    return addresses[0]


def address_refusal(address: IPAddress, extra: Sequence[policy.IPNetwork] = ()) -> str | None:
    """Why the SSRF guard refuses `address`, or None for a public unicast address.

    `extra` are further refused networks (the cluster's service and pod CIDRs). IPv6 addresses
    that embed an IPv4 address (IPv4-mapped, 6to4, Teredo) are judged by the embedded address too.
    """
    if isinstance(address, ipaddress.IPv6Address):
        embedded = (
            address.ipv4_mapped
            or address.sixtofour
            or (address.teredo[1] if address.teredo else None)
        )
        if embedded is not None:
            inner = address_refusal(embedded, extra)
            if inner is not None:
                return f"which embeds {embedded}, {inner}"
    for network in extra:
        if address.version == network.version and address in network:
            return f"inside the cluster network {network}"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address (cloud metadata lives there)"
    if address.is_multicast or address.is_unspecified or address.is_reserved:
        return "not a unicast address"
    if not address.is_global:
        return "a private or otherwise non-public address"
    return None


def host_allowed(host: str, allowed: frozenset[str]) -> bool:
    """Whether the admin's allow-list names `host` (or, with a leading dot, a parent domain)."""
    lowered = host.lower().rstrip(".")
    for entry in allowed:
        entry = entry.lower().rstrip(".")
        if entry.startswith("."):
            if lowered == entry[1:] or lowered.endswith(entry):
                return True
        elif lowered == entry:
            return True
    return False


def describe(error: BaseException) -> str:
    """`Type: message` of a low-level error, for a condition message."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _literal_address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None
