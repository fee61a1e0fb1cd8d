"""Status builders and readers: what is written is read back the same."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kubeseer.operator import dljob
from kubeseer.operator import status as st

NOW = datetime(2026, 11, 22, 4, 0, 0, tzinfo=UTC)


def test_prediction_round_trips_through_status(prediction: Any) -> None:
    p = prediction(memory_gib=3.0, upper_gib=4.0)
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
