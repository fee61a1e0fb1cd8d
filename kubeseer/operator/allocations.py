"""Under DRA: a claim of an attempt was allocated; the DLJob's status says which device it got.

The claim (made by the resourceclaim controller from the attempt's template) carries the
DLJob's labels and full name. Its allocation becomes `status.allocation`, the placement becomes
the device allocated (an out-of-memory escalation grows from its usable memory), the plan's
row of the rung taken is marked chosen, and an event says whether it was the first choice.
Claims of an older attempt, or one already recorded, change nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kubeseer.operator import dljob, journal, ports, serial
from kubeseer.operator import status as st
from kubeseer.operator.dra import allocation
from kubeseer.operator.dra import inventory as dra_inventory

Reason = dljob.Reason

DeviceLookup = Callable[[dra_inventory.DeviceKey], dra_inventory.Device | None]


class Allocations:
    """Records what DRA allocated.

    Args:
        cluster: DLJob reads.
        log: status writes and events.
        devices: the published device of a (pool, name), when the slices know it.
        locks: one DLJob's events one at a time.
    """

    def __init__(
        self,
        cluster: ports.Cluster,
        log: journal.Journal,
        devices: DeviceLookup,
        locks: serial.KeyedLocks,
    ) -> None:
        self.cluster = cluster
        self.log = log
        self.devices = devices
        self.locks = locks

    def observe(
        self, namespace: str, dljob_name: str, attempt: int, claim: Mapping[str, Any]
    ) -> None:
        """Record the claim's allocation in the DLJob's status (once)."""
        try:
            allocated = allocation.read(claim)
        except ValueError:
            return  # not a claim of kubeseer's shape (someone else's labels)
        if allocated is None:
            return
        with self.locks.hold(f"{namespace}/{dljob_name}"):
            body = self.cluster.get_dljob(namespace, dljob_name)
            if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
                return
            raw = body.get("status") or {}
            state = st.read(raw)
            placed = state.placed
            if state.phase is None or state.phase.terminal or placed is None:
                return
            if placed.attempt != attempt or allocated.claim in allocation.recorded_claims(
                raw, attempt
            ):
                return
            ref = dljob.DLJobRef(namespace, dljob_name, str(body["metadata"]["uid"]))
            self._record(ref, state, raw, placed, allocated)

    def _record(
        self,
        ref: dljob.DLJobRef,
        state: st.DLJobStatus,
        raw: Mapping[str, Any],
        placed: st.PlacedAttempt,
        allocated: allocation.ClaimAllocation,
    ) -> None:
        fields: dict[str, Any] = {
            "allocation": allocation.status_fields(raw, placed.attempt, allocated)
        }
        first_of_attempt = not allocation.recorded_claims(raw, placed.attempt)
        found = allocated.found
        if first_of_attempt:
            device = self.devices((found.pool, found.device))
            now = allocation.placement(placed.placement, allocated, device, state.plan)
            fields["placement"] = st.build_placement_status(now, placed.attempt)
            note = f"allocated: {found.device} on {found.pool}" + (
                " (first choice)" if found.first_choice else ""
            )
            marked = allocation.plan_marked(state.plan, allocated.rank, note)
            if marked is not None:
                fields["plan"] = marked
        self.log.write(ref, state, st.Patch(fields))
        choice = (
            "the first choice"
            if found.first_choice
            else "a later rung: no cheaper rung had a free device"
        )
        self.log.emit(
            ref,
            ports.EventType.NORMAL,
            Reason.ALLOCATED,
            f"claim {allocated.claim}: {found.device} on {found.pool}, rung {found.rung} "
            f"({choice})",
        )
