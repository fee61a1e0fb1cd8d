"""The observation store on a directory and on a real S3-protocol server (moto)."""

import os

import boto3
import moto.server as moto_server
import pytest

from kubeseer.observations import record, store

GIB = 1 << 30


def test_an_observation_round_trips_through_its_arrow_row(make_observation):
    o = make_observation(outcome=record.Outcome.OOM, observed=None, limit=10 * GIB)
    assert record.from_row(record.to_row(o)) == o
    assert o.censored and o.memory_label == 10 * GIB


def test_an_identifier_that_is_not_the_hash_of_the_attempt_is_refused(make_observation):
    o = make_observation()
    with pytest.raises(ValueError, match="hash"):
        record.Observation(**{**record.to_row(o), "attempt": 3, "outcome": o.outcome})


def exercise(s: store.Store, make_observation, damage):
    """The same behaviour whatever the backend."""
    first = make_observation("uid-1", 0, recorded_at="2026-11-25T12:00:00Z")
    s.put(first)
    s.put(first)  # idempotent: the same attempt, one record
    assert s.read().observations == [first]
    assert s.exists(first.observation_id)
    updated = make_observation("uid-1", 0, observed=5 * GIB, recorded_at="2026-11-25T12:01:00Z")
    s.put(updated)  # the profiler's final report came later: the latest write wins
    others = [
        make_observation(f"uid-{i}", 1, finished_at=f"2026-11-25T12:0{i}:00Z") for i in range(2, 5)
    ]
    for o in others:
        s.put(o)
    damage(s, store.Store.name(others[0].observation_id))
    got = s.read()
    assert {o.observation_id for o in got.observations} == {
        updated.observation_id,
        others[1].observation_id,
        others[2].observation_id,
    }
    assert (
        next(o for o in got.observations if o.dljob_uid == "uid-1").observed_peak_memory_bytes
        == 5 * GIB
    )
    assert len(got.damaged) == 1 and others[0].observation_id in got.damaged[0]
    # Compaction merges what it can read and never deletes what it could not.
    assert s.compact() == 3
    again = s.read()
    assert {o.observation_id for o in again.observations} == {
        o.observation_id for o in got.observations
    }
    assert len(again.damaged) == 1
    # A later write of a compacted attempt still wins.
    s.put(make_observation("uid-2", 1, observed=GIB, recorded_at="2026-11-25T13:00:00Z"))
    assert (
        next(o for o in s.read().observations if o.dljob_uid == "uid-2").observed_peak_memory_bytes
        == GIB
    )


def truncate_file(root):
    def damage(_s, name):
        path = root / name
        path.write_bytes(path.read_bytes()[:100])

    return damage


def test_a_directory_store_is_idempotent_and_loses_nothing_to_a_damaged_file(
    tmp_path, make_observation
):
    exercise(store.open_store(str(tmp_path)), make_observation, truncate_file(tmp_path))


def test_a_write_interrupted_before_its_rename_is_invisible(tmp_path, make_observation):
    s = store.open_store(str(tmp_path))
    s.put(make_observation("uid-1"))
    # What a process killed mid-write leaves behind: a hidden, half-written temporary file.
    (tmp_path / "observations" / ".obs-0123.parquet.4242-deadbeef.tmp").write_bytes(b"PAR1\x00")
    got = s.read()
    assert [o.dljob_uid for o in got.observations] == ["uid-1"] and got.damaged == []


def test_records_outlive_the_process_that_wrote_them(tmp_path, make_observation):
    store.open_store(f"file://{tmp_path}").put(make_observation("uid-1"))
    assert [o.dljob_uid for o in store.open_store(str(tmp_path)).read().observations] == ["uid-1"]


def test_an_unknown_location_is_refused():
    with pytest.raises(store.StoreError):
        store.open_store("ftp://somewhere/x")
    with pytest.raises(store.StoreError):
        store.open_store("s3:///no-bucket")


@pytest.fixture(scope="module")
def s3_endpoint():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def test_an_s3_store_behaves_the_same(s3_endpoint, make_observation, monkeypatch):
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    client.create_bucket(Bucket="kubeseer")
    settings = store.S3Settings(
        endpoint_url=s3_endpoint, access_key_id="test", secret_access_key="test"
    )
    s = store.open_store("s3://kubeseer/cluster-a", settings)

    def damage(_s, name):
        client.put_object(Bucket="kubeseer", Key=f"cluster-a/{name}", Body=b"not parquet")

    exercise(s, make_observation, damage)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="kubeseer")["Contents"]]
    assert all(k.startswith("cluster-a/observations/") for k in keys)
    client.close()


def test_a_graph_is_stored_once_under_its_name(tmp_path):
    s = store.open_store(str(tmp_path))
    name = store.Store.graph_name("ab" * 32, '{"seq":128}', 8)
    assert name.startswith(f"graphs/{'ab' * 32}/") and name.endswith("-b8.npz")
    s.put_graph(name, b"first")
    s.put_graph(name, b"second")
    assert s.get_graph(name) == b"first"
    assert s.get_graph(store.Store.graph_name("cd" * 32, "{}", 8)) is None
    with pytest.raises(ValueError):
        store.Store.graph_name("../etc", "{}", 1)
    assert os.listdir(tmp_path) == ["graphs"]


WRITER = """
import sys
from kubeseer.observations import record, store
sys.path.insert(0, sys.argv[2])
from conftest import observation
s = store.open_store(sys.argv[1])
i = 0
while True:
    s.put(observation(f"uid-{i}", 0, observed=(i + 1) << 20))
    i += 1
"""


def test_a_writer_killed_mid_write_leaves_only_whole_records(tmp_path):
    """SIGKILL a process that writes observations as fast as it can, at a random moment."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    here = Path(__file__).parent
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path / "store"), str(here)],
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            written = list((tmp_path / "store" / "observations").glob("obs-*.parquet"))
            if len(written) >= 20:
                break
            assert writer.poll() is None, writer.stderr.read().decode() if writer.stderr else ""
            time.sleep(0.05)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        if writer.stderr is not None:
            writer.stderr.close()
    got = store.open_store(str(tmp_path / "store")).read()
    assert got.damaged == []
    assert len(got.observations) >= 20
    assert all(
        o.observed_peak_memory_bytes == (int(o.dljob_uid[4:]) + 1) << 20 for o in got.observations
    )
