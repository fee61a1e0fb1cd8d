from __future__ import annotations

import hashlib
import ipaddress
import os
import time

import pytest
from fetch_server import MODEL, make_tls, serve

from kubeseer import metrics
from kubeseer.operator import fetch

MODEL_SHA = hashlib.sha256(MODEL).hexdigest()


@pytest.fixture
def server():
    with serve() as (base, routes):
        yield base, routes


def policy(tmp_path, **overrides) -> fetch.FetchPolicy:
    """Fast limits for tests; 127.0.0.1 is allow-listed so the local server is reachable."""
    settings = {
        "allowed_hosts": frozenset({"127.0.0.1"}),
        "connect_timeout_s": 1.0,
        "read_timeout_s": 0.2,
        "total_timeout_s": 10.0,
        "retries": 2,
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.02,
        "cache_dir": tmp_path / "cache",
    }
    settings.update(overrides)
    return fetch.FetchPolicy(**settings)


def test_fetches_streams_and_caches_by_digest(server, tmp_path):
    base, _routes = server
    got = fetch.fetch(fetch.ModelSource(base + "/model"), policy(tmp_path))
    assert (got.sha256, got.size, got.from_cache) == (MODEL_SHA, len(MODEL), False)
    assert got.read_bytes() == MODEL
    assert got.path == tmp_path / "cache" / MODEL_SHA


def test_a_known_digest_is_served_from_the_cache_without_the_network(server, tmp_path):
    base, routes = server
    source = fetch.ModelSource(base + "/model", sha256=MODEL_SHA)
    first = fetch.fetch(source, policy(tmp_path))
    again = fetch.fetch(source, policy(tmp_path))
    assert (first.from_cache, again.from_cache) == (False, True)
    assert routes.hits["/model"] == 1
    assert again.read_bytes() == MODEL


def test_digest_mismatch_is_final_and_leaves_nothing_in_the_cache(server, tmp_path):
    base, routes = server
    wrong = "0" * 64
    with pytest.raises(
        fetch.DigestMismatchError, match=f"has sha256 {MODEL_SHA}, not the {wrong}"
    ) as e:
        fetch.fetch(fetch.ModelSource(base + "/model", sha256=wrong), policy(tmp_path))
    assert e.value.failure is metrics.FetchFailure.DIGEST_MISMATCH and not e.value.transient
    assert routes.hits["/model"] == 1
    assert os.listdir(tmp_path / "cache") == []


def test_a_declared_length_over_the_limit_is_refused_before_reading(server, tmp_path):
    base, _ = server
    with pytest.raises(fetch.TooLargeError, match=r"declares 1000000000000 bytes"):
        fetch.fetch(fetch.ModelSource(base + "/declared-big"), policy(tmp_path))


def test_a_chunked_body_is_cut_off_at_the_size_limit(server, tmp_path):
    base, routes = server
    with pytest.raises(fetch.TooLargeError, match="more than the limit of 65536 bytes") as e:
        fetch.fetch(fetch.ModelSource(base + "/chunked-big"), policy(tmp_path, max_bytes=65536))
    assert e.value.failure is metrics.FetchFailure.TOO_LARGE
    assert routes.hits["/chunked-big"] == 1  # not retried
    assert os.listdir(tmp_path / "cache") == []


def test_transient_server_errors_are_retried_with_backoff(server, tmp_path):
    base, routes = server
    got = fetch.fetch(fetch.ModelSource(base + "/flaky"), policy(tmp_path, retries=2))
    assert got.read_bytes() == MODEL
    assert routes.hits["/flaky"] == 3


def test_retries_stop_after_the_configured_number_of_attempts(server, tmp_path):
    base, routes = server
    routes.failures_before_success = 10
    start = time.monotonic()
    with pytest.raises(fetch.UnreachableError, match="answered 503") as e:
        fetch.fetch(
            fetch.ModelSource(base + "/flaky"),
            policy(tmp_path, retries=3, backoff_base_s=0.05, backoff_max_s=0.1),
        )
    assert routes.hits["/flaky"] == 4
    assert e.value.transient and e.value.failure is metrics.FetchFailure.UNREACHABLE
    # Backoff before retries 1..3 is at least 0.025 + 0.05 + 0.05 seconds (half of each ceiling).
    assert time.monotonic() - start >= 0.125


@pytest.mark.parametrize(
    ("path", "failure"),
    [("/missing", metrics.FetchFailure.NOT_FOUND), ("/forbidden", metrics.FetchFailure.REFUSED)],
)
def test_client_errors_are_not_retried(server, tmp_path, path, failure):
    base, routes = server
    with pytest.raises(fetch.HTTPStatusError) as e:
        fetch.fetch(fetch.ModelSource(base + path), policy(tmp_path))
    assert routes.hits[path] == 1
    assert e.value.failure is failure and not e.value.transient


def test_a_server_slower_than_the_read_timeout_is_unreachable_after_every_attempt(server, tmp_path):
    base, routes = server
    routes.slow_seconds = 1.0
    with pytest.raises(fetch.UnreachableError, match="TimeoutError"):
        fetch.fetch(
            fetch.ModelSource(base + "/slow"), policy(tmp_path, read_timeout_s=0.1, retries=1)
        )
    assert routes.hits["/slow"] == 2


def test_a_body_shorter_than_its_declared_length_is_a_transient_failure(server, tmp_path):
    base, routes = server
    with pytest.raises(fetch.UnreachableError):
        fetch.fetch(fetch.ModelSource(base + "/short"), policy(tmp_path, retries=1))
    assert routes.hits["/short"] == 2


def test_redirects_on_an_allowed_host_are_followed(server, tmp_path):
    base, routes = server
    got = fetch.fetch(fetch.ModelSource(base + "/redirect-ok"), policy(tmp_path))
    assert got.sha256 == MODEL_SHA
    assert (routes.hits["/redirect-ok"], routes.hits["/model"]) == (1, 1)


@pytest.mark.parametrize(
    ("path", "error", "message"),
    [
        ("/redirect-metadata", fetch.ForbiddenAddressError, "169.254.169.254, a link-local"),
        ("/redirect-localhost", fetch.ForbiddenAddressError, "'localhost' is a cluster-internal"),
        ("/redirect-scheme", fetch.TooManyRedirectsError, "file:///etc/passwd"),
        ("/loop", fetch.TooManyRedirectsError, "more than 3 redirects"),
    ],
)
def test_every_redirect_hop_is_checked_again(server, tmp_path, path, error, message):
    base, routes = server
    with pytest.raises(error, match=message):
        fetch.fetch(fetch.ModelSource(base + path), policy(tmp_path, max_redirects=3))
    assert routes.hits["/model"] == 0


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/iam",
        "http://127.0.0.1:9/model",
        "http://10.0.0.7/model.onnx",
        "http://192.168.1.10/model.onnx",
        "http://100.64.3.4/model.onnx",
        "http://[::1]/model.onnx",
        "http://[fe80::1]/model.onnx",
        "http://[fd12:3456::1]/model.onnx",
        "http://[::ffff:169.254.169.254]/model.onnx",
        "http://0.0.0.0/model.onnx",
        "http://kubernetes.default.svc/api",
        "http://minio.storage.svc.cluster.local:9000/models/m.onnx",
        "http://localhost:8080/model.onnx",
        "http://metadata/computeMetadata/v1/",
    ],
)
def test_internal_targets_are_refused_without_connecting(tmp_path, url):
    resolved: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        resolved.append(host)
        return ["127.0.0.1"]

    with pytest.raises(fetch.ForbiddenAddressError) as e:
        fetch.fetch(
            fetch.ModelSource(url), policy(tmp_path, allowed_hosts=frozenset(), resolver=resolver)
        )
    assert e.value.failure is metrics.FetchFailure.REFUSED
    assert resolved == []  # literal addresses and internal names never reach DNS


@pytest.mark.parametrize(
    ("answers", "refused"),
    [(["10.1.2.3"], "10.1.2.3"), (["93.184.216.34", "127.0.0.1"], "127.0.0.1")],
)
def test_a_public_name_resolving_to_an_internal_address_is_refused(tmp_path, answers, refused):
    with pytest.raises(fetch.ForbiddenAddressError, match=f"resolves to {refused}"):
        fetch.fetch(
            fetch.ModelSource("https://models.example.com/m.onnx"),
            policy(tmp_path, allowed_hosts=frozenset(), resolver=lambda h, p: answers),
        )


def test_the_connection_goes_to_the_address_that_was_checked(server, tmp_path):
    base, routes = server
    port = base.rsplit(":", 1)[1]
    calls: list[str] = []

    def rebinding(host: str, _port: int) -> list[str]:
        calls.append(host)
        # A second answer would point elsewhere; fetch must never ask twice for one hop.
        return ["127.0.0.1"] if len(calls) == 1 else ["10.9.9.9"]

    got = fetch.fetch(
        fetch.ModelSource(f"http://models.example.com:{port}/model"),
        policy(tmp_path, allowed_hosts=frozenset({".example.com"}), resolver=rebinding),
    )
    assert got.sha256 == MODEL_SHA
    assert calls == ["models.example.com"]
    assert routes.hosts == [f"models.example.com:{port}"]


def test_admin_cluster_cidrs_are_refused_even_when_public(tmp_path):
    cidr = ipaddress.ip_network("198.51.0.0/16")  # pretend the pod CIDR is public space
    with pytest.raises(
        fetch.ForbiddenAddressError, match=r"inside the cluster network 198\.51\.0\.0/16"
    ):
        fetch.fetch(
            fetch.ModelSource("http://models.example.org/m.onnx"),
            policy(tmp_path, forbidden_networks=(cidr,), resolver=lambda h, p: ["198.51.7.7"]),
        )


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.0.1", "private"),
        ("100.64.0.1", "private"),
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("fd00::1", "private"),
        ("::ffff:10.0.0.1", "embeds 10.0.0.1"),
        ("2002:a00:1::", "embeds 10.0.0.1"),
        ("224.0.0.1", "not a unicast"),
        ("0.0.0.0", "not a unicast"),
        ("8.8.8.8", None),
        ("2001:4860:4860::8888", None),
    ],
)
def test_address_refusal_table(address, reason):
    verdict = fetch.address_refusal(ipaddress.ip_address(address))
    if reason is None:
        assert verdict is None
    else:
        assert verdict is not None and reason in verdict


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.com/m.onnx", "unsupported URL scheme 'ftp'"),
        ("http:///m.onnx", "has no host"),
        ("https://user:pw@example.com/m.onnx", "carries credentials"),
        ("http://example.com:99999/m.onnx", "malformed URL"),
        ("s3://bucket/key.onnx", "no S3 endpoint"),
    ],
)
def test_bad_urls_are_typed_errors(tmp_path, url, message):
    with pytest.raises(fetch.BadURLError, match=message):
        fetch.fetch(fetch.ModelSource(url), policy(tmp_path))


def test_a_malformed_digest_is_refused_up_front():
    with pytest.raises(fetch.BadURLError, match="not 64 lowercase hexadecimal"):
        fetch.ModelSource("https://example.com/m.onnx", sha256="ABC")


def test_from_bytes_applies_the_same_limit_and_digest(tmp_path):
    p = policy(tmp_path, max_bytes=len(MODEL))
    got = fetch.from_bytes(MODEL, p, sha256=MODEL_SHA, source="ConfigMap ns/m")
    assert (got.sha256, got.size, got.read_bytes()) == (MODEL_SHA, len(MODEL), MODEL)
    assert fetch.from_bytes(MODEL, p).from_cache is True
    with pytest.raises(fetch.TooLargeError, match="ConfigMap ns/m"):
        fetch.from_bytes(MODEL + b"!", p, source="ConfigMap ns/m")
    with pytest.raises(fetch.DigestMismatchError):
        fetch.from_bytes(MODEL, p, sha256="f" * 64)


def test_the_cache_evicts_least_recently_used_models_past_its_bound(server, tmp_path):
    base, _ = server
    p = policy(tmp_path, cache_max_bytes=2 * 2048 + 100)  # /a, /b, /c are 2 KiB each
    a = fetch.fetch(fetch.ModelSource(base + "/a"), p)
    b = fetch.fetch(fetch.ModelSource(base + "/b"), p)
    os.utime(a.path, (time.time() - 60, time.time() - 60))
    os.utime(b.path, (time.time() - 30, time.time() - 30))
    fetch.fetch(fetch.ModelSource(base + "/a", sha256=a.sha256), p)  # a hit makes a recent
    c = fetch.fetch(fetch.ModelSource(base + "/c"), p)
    assert sorted(os.listdir(tmp_path / "cache")) == sorted([a.sha256, c.sha256])
    assert not b.path.exists()


def test_a_cache_directory_that_cannot_be_written_is_a_cache_error(server, tmp_path):
    base, _ = server
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(fetch.CacheError, match="cannot write to the model cache"):
        fetch.fetch(fetch.ModelSource(base + "/model"), policy(tmp_path, cache_dir=blocker / "c"))


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_bytes": 0},
        {"read_timeout_s": 0},
        {"retries": -1},
        {"backoff_base_s": 2, "backoff_max_s": 1},
    ],
)
def test_nonsensical_policies_are_rejected(tmp_path, overrides):
    with pytest.raises(ValueError, match="fetch policy"):
        policy(tmp_path, **overrides)


@pytest.fixture
def tls_server(tmp_path):
    context, ca = make_tls(tmp_path, "models.example.com")
    with serve(tls=context) as (base, routes):
        yield base.rsplit(":", 1)[1], routes, ca


def test_https_verifies_the_url_host_while_connecting_to_the_pinned_address(tls_server, tmp_path):
    port, routes, ca = tls_server
    got = fetch.fetch(
        fetch.ModelSource(f"https://models.example.com:{port}/model"),
        policy(
            tmp_path,
            allowed_hosts=frozenset({"models.example.com"}),
            resolver=lambda h, p: ["127.0.0.1"],
            ca_file=ca,
        ),
    )
    assert got.sha256 == MODEL_SHA
    assert routes.hosts == [f"models.example.com:{port}"]


def test_a_certificate_for_another_name_is_final_not_retried(tls_server, tmp_path):
    port, routes, ca = tls_server
    with pytest.raises(fetch.TLSError, match="Hostname mismatch") as e:
        fetch.fetch(
            fetch.ModelSource(f"https://mirror.example.com:{port}/model"),
            policy(
                tmp_path,
                allowed_hosts=frozenset({".example.com"}),
                resolver=lambda h, p: ["127.0.0.1"],
                ca_file=ca,
            ),
        )
    assert e.value.failure is metrics.FetchFailure.REFUSED and not e.value.transient
    assert routes.hits == {}


def test_a_redirect_from_https_down_to_http_is_refused(tls_server, tmp_path):
    port, routes, ca = tls_server
    with pytest.raises(fetch.TooManyRedirectsError, match="from https to http"):
        fetch.fetch(
            fetch.ModelSource(f"https://models.example.com:{port}/redirect-http"),
            policy(
                tmp_path,
                allowed_hosts=frozenset({"models.example.com", "127.0.0.1"}),
                resolver=lambda h, p: ["127.0.0.1"],
                ca_file=ca,
            ),
        )
    assert routes.hits["/model"] == 0
