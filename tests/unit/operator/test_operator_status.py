"""Status builders and readers: what is written is read back the same."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kubeseer.operator import dljob
from kubeseer.operator import status as st

NOW = datetime(2026, 11, 22, 4, 0, 0, tzinfo=UTC)


def test_prediction_round_trips_through_status(prediction: Any) -> None:
    p = prediction(memory_gib=3.0, upper_gib=4.0)
    assert st.read_prediction({"prediction": st.build_prediction_status(p)}) == p


def test_the_steps_work_round_trips_so_an_escalation_keeps_its_derived_slowdown(
    prediction: Any,
) -> None:
    from kubeseer.prediction import StepWork

    p = replace(
        prediction(memory_gib=3.0, upper_gib=4.0),
        work=StepWork(flops=3.2e12, bytes_moved=4.5e10, kernels=612),
    )
    assert st.read_prediction({"prediction": st.build_prediction_status(p)}) == p


def test_prediction_status_shows_point_and_upper_mib_for_the_printer_column(
    prediction: Any,
) -> None:
    assert st.build_prediction_status(prediction(3.0, 4.0))["memoryMiB"] == "3072/4096"


def test_placement_round_trips_through_status(mig_placement: Any) -> None:
    assert st.read_placement({"placement": st.build_placement_status(mig_placement, 1)}) == (
        mig_placement,
        1,
    )


@pytest.mark.parametrize("raw", [None, "x", {}, {"resource": "r"}])
def test_unreadable_status_reads_as_absent(raw: object) -> None:
    assert st.read_placement({"placement": raw}) is None
    assert st.read_prediction({"prediction": raw}) is None


def test_unknown_phase_reads_as_none() -> None:
    assert st.read_phase({"phase": "Exploded"}) is None
    assert st.read_phase({"phase": "Placed"}) is dljob.Phase.PLACED


def test_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    first = st.build_condition(dljob.ConditionType.PLACED, True, dljob.Reason.PLACED, "a", NOW)
    later = st.build_condition(
        dljob.ConditionType.PLACED, True, dljob.Reason.ESCALATED, "b", NOW + timedelta(hours=1)
    )
    merged = st.merge_conditions([first], later)
    assert merged == [{**later, "lastTransitionTime": "2026-11-22T04:00:00Z"}]


def test_condition_changes_its_transition_time_when_its_status_flips() -> None:
    other = st.build_condition(dljob.ConditionType.PREDICTED, True, dljob.Reason.PREDICTED, "", NOW)
    first = st.build_condition(dljob.ConditionType.PLACED, True, dljob.Reason.PLACED, "", NOW)
    flipped = st.build_condition(
        dljob.ConditionType.PLACED, False, dljob.Reason.NO_FIT, "", NOW + timedelta(seconds=5)
    )
    assert st.merge_conditions([other, first], flipped) == [other, flipped]


def test_timestamps_are_utc_rfc3339() -> None:
    assert st.timestamp(NOW.astimezone(tz=UTC)) == "2026-11-22T04:00:00Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        st.timestamp(datetime(2026, 1, 1))


def test_an_oom_attempt_records_a_censored_lower_bound(mig_placement: Any) -> None:
    entry = st.build_attempt(mig_placement, 0, "resnet-0", st.OUTCOME_OOM, "OOMKilled")
    assert entry["observation"] == {
        "memoryBytesAtLeast": 9728 << 20,
        "censored": True,
        "source": "oom",
    }
    assert "observation" not in st.build_attempt(mig_placement, 0, "resnet-0", st.OUTCOME_SUCCEEDED)


def test_a_placement_without_a_slowdown_figure_survives_a_merge_patch(mig_placement: Any) -> None:
    """A merge patch drops null fields: the stored placement has no `predictedSlowdown` at all,
    and must still read back (it did not, and the DLJob never left Placed)."""
    placement = replace(mig_placement, predicted_slowdown=None, node_hint=None)
    written = st.build_placement_status(placement, 0)
    stored = {k: v for k, v in written.items() if v is not None}
    assert st.read_placement({"placement": stored}) == (placement, 0)


def test_a_patch_merges_its_conditions_into_the_stored_ones_and_later_steps_win() -> None:
    stored = st.read(
        {
            "phase": "Fetching",
            "conditions": [
                st.build_condition(
                    dljob.ConditionType.ACCEPTED, True, dljob.Reason.ACCEPTED, "ok", NOW
                )
            ],
        }
    )
    ready = st.build_condition(
        dljob.ConditionType.MODEL_READY, False, dljob.Reason.MODEL_UNREACHABLE, "x", NOW
    )
    fetched = st.build_condition(
        dljob.ConditionType.MODEL_READY, True, dljob.Reason.FETCHED, "y", NOW
    )
    patch = (
        st.Patch({"model": "m"}, (ready,))
        .then(st.progress(dljob.Phase.PREDICTING))
        .then(st.Patch(conditions=(fetched,)))
    )
    body = patch.body(stored)
    assert body["phase"] == "Predicting" and body["reason"] is None and body["model"] == "m"
    assert [(c["type"], c["status"]) for c in body["conditions"]] == [
        ("Accepted", "True"),
        ("ModelReady", "True"),
    ]
