"""s3:// fetches against a real S3-protocol server (moto in server mode) that checks signatures."""

from __future__ import annotations

import datetime as dt
import hashlib
import json

import boto3
import botocore.auth
import botocore.awsrequest
import botocore.credentials
import moto.core.authorization as moto_auth
import moto.server as moto_server
import pytest

from kubeseer import metrics
from kubeseer.operator.fetch import download, errors
from kubeseer.operator.fetch import policy as fetch_policy
from kubeseer.operator.fetch import s3 as s3_signing

BUCKET = "models"
KEY = "zoo/resnet 50+v1.onnx"  # a space and a plus: the signed path must be encoded as sent
BODY = bytes(range(256)) * 512
READ_ONLY_POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": "*"}],
}


@pytest.fixture(scope="module")
def s3():
    """A moto server with one object and an IAM user allowed to read it; yields (url, creds)."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        admin = {
            "endpoint_url": endpoint,
            "region_name": "us-east-1",
            "aws_access_key_id": "admin",
            "aws_secret_access_key": "admin",
        }
        s3_client = boto3.client("s3", **admin)
        s3_client.create_bucket(Bucket=BUCKET)
        s3_client.put_object(Bucket=BUCKET, Key=KEY, Body=BODY)
        iam = boto3.client("iam", **admin)
        iam.create_user(UserName="kubeseer")
        iam.put_user_policy(
            UserName="kubeseer", PolicyName="read", PolicyDocument=json.dumps(READ_ONLY_POLICY)
        )
        key = iam.create_access_key(UserName="kubeseer")["AccessKey"]
        creds = fetch_policy.S3Credentials(key["AccessKeyId"], key["SecretAccessKey"])
        s3_client.close()
        iam.close()
        yield endpoint, creds
    finally:
        server.stop()


def s3_policy(tmp_path, endpoint, creds, **overrides) -> fetch_policy.FetchPolicy:
    settings = {
        "s3_endpoint": fetch_policy.S3Endpoint(endpoint),
        "s3_credentials": creds,
        "cache_dir": tmp_path / "cache",
        "retries": 0,
        "read_timeout_s": 5.0,
    }
    settings.update(overrides)
    return fetch_policy.FetchPolicy(**settings)


def test_signed_s3_get_is_accepted_by_a_server_that_verifies_signatures(s3, tmp_path):
    endpoint, creds = s3
    # The endpoint is loopback, yet needs no allow-listing: the admin configured it.
    with moto_auth.enable_iam_authentication():
        got = download.fetch(
            f"s3://{BUCKET}/{KEY}",
            s3_policy(tmp_path, endpoint, creds),
            sha256=hashlib.sha256(BODY).hexdigest(),
        )
    assert got.path.read_bytes() == BODY and got.size == len(BODY)


def test_a_wrong_secret_is_refused_by_the_server(s3, tmp_path):
    endpoint, creds = s3
    wrong = fetch_policy.S3Credentials(creds.access_key_id, "not-the-secret")
    with (
        moto_auth.enable_iam_authentication(),
        pytest.raises(errors.AccessDeniedError, match="answered 403") as e,
    ):
        download.fetch(f"s3://{BUCKET}/{KEY}", s3_policy(tmp_path, endpoint, wrong))
    assert e.value.failure is metrics.FetchFailure.REFUSED


def test_a_missing_object_is_not_found(s3, tmp_path):
    endpoint, creds = s3
    with moto_auth.enable_iam_authentication(), pytest.raises(errors.NotFoundError) as e:
        download.fetch(f"s3://{BUCKET}/absent.onnx", s3_policy(tmp_path, endpoint, creds))
    assert e.value.failure is metrics.FetchFailure.NOT_FOUND


def test_s3_objects_obey_the_size_limit(s3, tmp_path):
    endpoint, creds = s3
    with pytest.raises(errors.TooLargeError):
        download.fetch(
            f"s3://{BUCKET}/{KEY}",
            s3_policy(tmp_path, endpoint, creds, max_bytes=1024),
        )


@pytest.mark.parametrize(
    ("url", "message"),
    [("s3://bucket-only", "must be s3://bucket/key"), ("s3:///key", "must be s3://bucket/key")],
)
def test_malformed_s3_urls_are_bad_urls(tmp_path, url, message):
    endpoint = fetch_policy.S3Endpoint("https://s3.example.com")
    with pytest.raises(errors.BadURLError, match=message):
        download.fetch(
            url,
            fetch_policy.FetchPolicy(s3_endpoint=endpoint, cache_dir=tmp_path),
        )


def test_s3_endpoint_must_be_a_bare_http_url():
    with pytest.raises(errors.BadURLError, match="must not have a path"):
        fetch_policy.S3Endpoint("https://s3.example.com/prefix")
    with pytest.raises(errors.BadURLError, match="http\\(s\\) URL"):
        fetch_policy.S3Endpoint("s3.example.com")


def test_signature_matches_the_aws_reference_implementation(monkeypatch):
    """Cross-check with botocore's signer on a virtual-host request with a session token."""
    now = dt.datetime(2026, 11, 22, 3, 4, 5, tzinfo=dt.UTC)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: now.replace(tzinfo=None))
    creds = fetch_policy.S3Credentials(
        "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "tok"
    )
    ours = s3_signing.sign_get(
        "bucket.s3.example.com:9000", "/a%20b/c.onnx", "eu-west-1", creds, now
    )

    request = botocore.awsrequest.AWSRequest(
        method="GET",
        url="https://bucket.s3.example.com:9000/a%20b/c.onnx",
        headers={"x-amz-content-sha256": hashlib.sha256(b"").hexdigest()},
    )
    signer = botocore.auth.S3SigV4Auth(
        botocore.credentials.Credentials(creds.access_key_id, creds.secret_access_key, "tok"),
        "s3",
        "eu-west-1",
    )
    signer.add_auth(request)
    assert ours["authorization"] == request.headers["Authorization"]
    assert ours["x-amz-date"] == request.headers["X-Amz-Date"] == "20261122T030405Z"
    assert ours["x-amz-security-token"] == request.headers["X-Amz-Security-Token"] == "tok"


def test_virtual_host_addressing_puts_the_bucket_in_the_host_name(s3, tmp_path):
    endpoint, creds = s3
    port = endpoint.rsplit(":", 1)[1]
    resolved: list[str] = []

    def resolver(host: str, _port: int) -> list[str]:
        resolved.append(host)
        return ["127.0.0.1"]

    virtual = fetch_policy.S3Endpoint(f"http://s3.amazonaws.com:{port}", addressing="virtual")
    with moto_auth.enable_iam_authentication():
        got = download.fetch(
            f"s3://{BUCKET}/{KEY}",
            s3_policy(tmp_path, endpoint, creds, s3_endpoint=virtual, resolver=resolver),
        )
    assert got.path.read_bytes() == BODY
    assert resolved == [f"{BUCKET}.s3.amazonaws.com"]
