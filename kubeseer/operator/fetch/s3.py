"""s3://bucket/key as a signed GET on the admin's S3-compatible endpoint.

Requests are signed with AWS Signature Version 4 here (stdlib `hmac`/`hashlib`) rather than
through boto3, so that S3 reads share the guarded connection, limits and retries of every other
fetch; docs/placement.md ("Fetching models") gives the reasoning.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import urllib.parse

from kubeseer.operator.fetch import policy


def object_url(endpoint: policy.S3Endpoint, bucket: str, key: str) -> str:
    """The http(s) URL of `key` in `bucket`, path- or virtual-host-addressed as configured."""
    base = urllib.parse.urlsplit(endpoint.url)
    quoted_key = urllib.parse.quote(key, safe="/~")
    if endpoint.addressing == "virtual":
        return f"{base.scheme}://{bucket}.{base.netloc}/{quoted_key}"
    return f"{base.scheme}://{base.netloc}/{urllib.parse.quote(bucket, safe='')}/{quoted_key}"


def sign_get(
    host: str,
    path: str,
    region: str,
    credentials: policy.S3Credentials,
    now: dt.datetime,
) -> dict[str, str]:
    """Headers that sign `GET path` on `host` with AWS Signature Version 4 (service s3).

    `host` is the Host header value (with `:port` when not the default); `path` is already
    URI-encoded, as sent. The payload hash is that of the empty body, as a GET has none.
    """
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    payload_hash = hashlib.sha256(b"").hexdigest()
    headers = {"host": host, "x-amz-content-sha256": payload_hash, "x-amz-date": amz_date}
    if credentials.session_token:
        headers["x-amz-security-token"] = credentials.session_token
    signed = ";".join(sorted(headers))
    canonical = "\n".join(
        [
            "GET",
            path,
            "",
            "".join(f"{name}:{headers[name].strip()}\n" for name in sorted(headers)),
            signed,
            payload_hash,
        ]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = ("AWS4" + credentials.secret_access_key).encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {name: value for name, value in headers.items() if name != "host"}
    out["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key_id}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    return out
