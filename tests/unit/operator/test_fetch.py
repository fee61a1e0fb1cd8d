from __future__ import annotations

import hashlib
import ipaddress
import os
import threading
import time

import pytest
from fetch_server import MODEL, make_tls, serve

from kubeseer import metrics
from kubeseer.operator.fetch import cancel, download, errors, guard
from kubeseer.operator.fetch import policy as fetch_policy

MODEL_SHA = hashlib.sha256(MODEL).hexdigest()


@pytest.fixture
def server():
    with serve() as (base, routes):
        yield base, routes


def policy(tmp_path, **overrides) -> fetch_policy.FetchPolicy:
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
    return fetch_policy.FetchPolicy(**settings)


def test_fetches_streams_and_caches_by_digest(server, tmp_path):
    base, _routes = server
    got = download.fetch(base + "/model", policy(tmp_path))
    assert (got.sha256, got.size, got.from_cache) == (MODEL_SHA, len(MODEL), False)
    assert got.path.read_bytes() == MODEL
    assert got.path == tmp_path / "cache" / MODEL_SHA


def test_a_pinned_digest_is_checked_against_what_the_source_serves_even_when_cached(
    server, tmp_path
):
    base, routes = server
    first = download.fetch(base + "/model", policy(tmp_path))
    with pytest.raises(errors.DigestMismatchError, match="/a has sha256"):
        download.fetch(base + "/a", policy(tmp_path), sha256=first.sha256)
    assert (routes.hits["/model"], routes.hits["/a"]) == (1, 1)


def test_digest_mismatch_is_final_and_leaves_nothing_in_the_cache(server, tmp_path):
    base, routes = server
    wrong = "0" * 64
    with pytest.raises(
        errors.DigestMismatchError, match=f"has sha256 {MODEL_SHA}, not the {wrong}"
    ) as e:
        download.fetch(base + "/model", policy(tmp_path), sha256=wrong)
    assert e.value.failure is metrics.FetchFailure.DIGEST_MISMATCH and not e.value.transient
    assert routes.hits["/model"] == 1
    assert os.listdir(tmp_path / "cache") == []


def test_a_declared_length_over_the_limit_is_refused_before_reading(server, tmp_path):
    base, _ = server
    with pytest.raises(errors.TooLargeError, match=r"declares 1000000000000 bytes"):
        download.fetch(base + "/declared-big", policy(tmp_path))


def test_a_chunked_body_is_cut_off_at_the_size_limit(server, tmp_path):
    base, routes = server
    with pytest.raises(errors.TooLargeError, match="more than the limit of 65536 bytes") as e:
        download.fetch(base + "/chunked-big", policy(tmp_path, max_bytes=65536))
    assert e.value.failure is metrics.FetchFailure.TOO_LARGE
    assert routes.hits["/chunked-big"] == 1  # not retried
    assert os.listdir(tmp_path / "cache") == []


def test_transient_server_errors_are_retried_with_backoff(server, tmp_path):
    base, routes = server
    got = download.fetch(base + "/flaky", policy(tmp_path, retries=2))
    assert got.path.read_bytes() == MODEL
    assert routes.hits["/flaky"] == 3


def test_retries_stop_after_the_configured_number_of_attempts(server, tmp_path):
    base, routes = server
    routes.failures_before_success = 10
    start = time.monotonic()
    with pytest.raises(errors.UnreachableError, match="answered 503") as e:
        download.fetch(
            base + "/flaky",
            policy(tmp_path, retries=3, backoff_base_s=0.05, backoff_max_s=0.1),
        )
    assert routes.hits["/flaky"] == 4
    assert e.value.transient and e.value.failure is metrics.FetchFailure.UNREACHABLE
    # Backoff before retries 1..3 is at least 0.025 + 0.05 + 0.05 seconds (half of each ceiling).
    assert time.monotonic() - start >= 0.125


@pytest.mark.parametrize(
    ("path", "error", "failure"),
    [
        ("/missing", errors.NotFoundError, metrics.FetchFailure.NOT_FOUND),
        ("/forbidden", errors.AccessDeniedError, metrics.FetchFailure.REFUSED),
    ],
)
def test_client_errors_are_not_retried(server, tmp_path, path, error, failure):
    base, routes = server
    with pytest.raises(error) as e:
        download.fetch(base + path, policy(tmp_path))
    assert routes.hits[path] == 1
    assert e.value.failure is failure and not e.value.transient


def test_a_server_slower_than_the_read_timeout_is_unreachable_after_every_attempt(server, tmp_path):
    base, routes = server
    routes.slow_seconds = 1.0
    with pytest.raises(errors.UnreachableError, match="TimeoutError"):
        download.fetch(
            base + "/slow",
            policy(tmp_path, read_timeout_s=0.1, retries=1),
        )
    assert routes.hits["/slow"] == 2


def test_a_source_that_trickles_fails_as_too_slow_after_the_grace_period(server, tmp_path):
    base, routes = server
    start = time.monotonic()
    with pytest.raises(errors.TooSlowError, match="under the minimum rate of 1 KiB/s") as e:
        download.fetch(base + "/trickle", policy(tmp_path, min_rate_bytes_s=1024, rate_grace_s=0.5))
    assert 0.5 <= time.monotonic() - start < 5
    assert e.value.failure is metrics.FetchFailure.TOO_SLOW and not e.value.transient
    assert routes.hits["/trickle"] == 1  # not retried: it would hold a fetch worker again


def test_the_total_deadline_ends_a_trickling_fetch(server, tmp_path):
    base, _ = server
    with pytest.raises(errors.TooSlowError, match=r"did not finish within 0\.6 s"):
        download.fetch(base + "/trickle", policy(tmp_path, total_timeout_s=0.6, min_rate_bytes_s=0))


def test_cancelling_interrupts_a_fetch_blocked_on_a_silent_server(server, tmp_path):
    base, _ = server
    cancellation = cancel.Cancellation()
    threading.Timer(0.3, cancellation.cancel).start()
    start = time.monotonic()
    with pytest.raises(errors.CancelledError):
        download.fetch(
            base + "/silent", policy(tmp_path, read_timeout_s=30.0), cancellation=cancellation
        )
    assert time.monotonic() - start < 3  # not the 30 s read timeout


def test_a_cancelled_fetch_does_not_wait_out_its_backoff(server, tmp_path):
    base, routes = server
    routes.failures_before_success = 10
    cancellation = cancel.Cancellation()
    threading.Timer(0.2, cancellation.cancel).start()
    start = time.monotonic()
    with pytest.raises(errors.CancelledError):
        download.fetch(
            base + "/flaky",
            policy(tmp_path, retries=5, backoff_base_s=5.0, backoff_max_s=5.0),
            cancellation=cancellation,
        )
    assert time.monotonic() - start < 2


def test_a_body_shorter_than_its_declared_length_is_a_transient_failure(server, tmp_path):
    base, routes = server
    with pytest.raises(errors.UnreachableError):
        download.fetch(base + "/short", policy(tmp_path, retries=1))
    assert routes.hits["/short"] == 2


def test_redirects_on_an_allowed_host_are_followed(server, tmp_path):
    base, routes = server
    got = download.fetch(base + "/redirect-ok", policy(tmp_path))
    assert got.sha256 == MODEL_SHA
    assert (routes.hits["/redirect-ok"], routes.hits["/model"]) == (1, 1)


@pytest.mark.parametrize(
    ("path", "error", "message"),
    [
        ("/redirect-metadata", errors.ForbiddenAddressError, "169.254.169.254, a link-local"),
        ("/redirect-localhost", errors.ForbiddenAddressError, "'localhost' is a cluster-internal"),
        ("/redirect-scheme", errors.TooManyRedirectsError, "file:///etc/passwd"),
        ("/loop", errors.TooManyRedirectsError, "more than 3 redirects"),
    ],
)
def test_every_redirect_hop_is_checked_again(server, tmp_path, path, error, message):
    base, routes = server
    with pytest.raises(error, match=message):
        download.fetch(base + path, policy(tmp_path, max_redirects=3))
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

    with pytest.raises(errors.ForbiddenAddressError) as e:
        download.fetch(
            url,
            policy(tmp_path, allowed_hosts=frozenset(), resolver=resolver),
        )
    assert e.value.failure is metrics.FetchFailure.REFUSED
    assert resolved == []  # literal addresses and internal names never reach DNS


@pytest.mark.parametrize(
    ("answers", "refused"),
    [(["10.1.2.3"], "10.1.2.3"), (["93.184.216.34", "127.0.0.1"], "127.0.0.1")],
)
def test_a_public_name_resolving_to_an_internal_address_is_refused(tmp_path, answers, refused):
    with pytest.raises(errors.ForbiddenAddressError, match=f"resolves to {refused}"):
        download.fetch(
            "https://models.example.com/m.onnx",
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

    got = download.fetch(
        f"http://models.example.com:{port}/model",
        policy(tmp_path, allowed_hosts=frozenset({".example.com"}), resolver=rebinding),
    )
    assert got.sha256 == MODEL_SHA
    assert calls == ["models.example.com"]
    assert routes.hosts == [f"models.example.com:{port}"]


def test_admin_cluster_cidrs_are_refused_even_when_public(tmp_path):
    cidr = ipaddress.ip_network("198.51.0.0/16")  # pretend the pod CIDR is public space
    with pytest.raises(
        errors.ForbiddenAddressError, match=r"inside the cluster network 198\.51\.0\.0/16"
    ):
        download.fetch(
            "http://models.example.org/m.onnx",
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
    verdict = guard.address_refusal(ipaddress.ip_address(address))
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
    with pytest.raises(errors.BadURLError, match=message):
        download.fetch(url, policy(tmp_path))


def test_a_malformed_digest_is_refused_up_front(tmp_path):
    with pytest.raises(errors.BadURLError, match="not 64 lowercase hexadecimal"):
        download.fetch("https://example.com/m.onnx", policy(tmp_path), sha256="ABC")


def test_from_bytes_applies_the_same_limit_and_digest(tmp_path):
    p = policy(tmp_path, max_bytes=len(MODEL))
    got = download.from_bytes(MODEL, p, sha256=MODEL_SHA, source="ConfigMap ns/m")
    assert (got.sha256, got.size, got.path.read_bytes()) == (MODEL_SHA, len(MODEL), MODEL)
    assert download.from_bytes(MODEL, p).from_cache is True
    with pytest.raises(errors.TooLargeError, match="ConfigMap ns/m"):
        download.from_bytes(MODEL + b"!", p, source="ConfigMap ns/m")
    with pytest.raises(errors.DigestMismatchError):
        download.from_bytes(MODEL, p, sha256="f" * 64)


def test_the_cache_evicts_least_recently_used_models_past_its_bound(server, tmp_path):
    base, _ = server
    p = policy(tmp_path, cache_max_bytes=2 * 2048 + 100)  # /a, /b, /c are 2 KiB each
    a = download.fetch(base + "/a", p)
    b = download.fetch(base + "/b", p)
    os.utime(a.path, (time.time() - 60, time.time() - 60))
    os.utime(b.path, (time.time() - 30, time.time() - 30))
    download.fetch(base + "/a", p, sha256=a.sha256)  # a hit makes a recent
    c = download.fetch(base + "/c", p)
    assert sorted(os.listdir(tmp_path / "cache")) == sorted([a.sha256, c.sha256])
    assert not b.path.exists()


def test_a_cache_directory_that_cannot_be_written_is_a_cache_error(server, tmp_path):
    base, _ = server
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(errors.CacheError, match="cannot write to the model cache"):
        download.fetch(base + "/model", policy(tmp_path, cache_dir=blocker / "c"))


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
    got = download.fetch(
        f"https://models.example.com:{port}/model",
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
    with pytest.raises(errors.TLSError, match="Hostname mismatch") as e:
        download.fetch(
            f"https://mirror.example.com:{port}/model",
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
    with pytest.raises(errors.TooManyRedirectsError, match="from https to http"):
        download.fetch(
            f"https://models.example.com:{port}/redirect-http",
            policy(
                tmp_path,
                allowed_hosts=frozenset({"models.example.com", "127.0.0.1"}),
                resolver=lambda h, p: ["127.0.0.1"],
                ca_file=ca,
            ),
        )
    assert routes.hits["/model"] == 0
