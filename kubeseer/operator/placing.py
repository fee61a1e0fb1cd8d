"""Choosing each attempt's device: the first placement, after an out-of-memory failure, after a
lost workload, and for pods that wait unschedulable while another kind is free (a move).

Placement itself is `kubeseer.placement.policy` (pure); this module reads the backend's free
capacity, counts the chosen device as taken at once (`Backend.assume`) and does both under one
lock, so that two DLJobs placed in the same instant never both count on the last free slice.
Every choice comes back as a `backends.Attempt`, ready for `launch`, with the plan it was chosen
from (which becomes `status.plan`, and under DRA the claim's ladder).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from kubeseer import metrics
from kubeseer.operator import backends, dljob, explain, journal, workload
from kubeseer.operator import status as st
from kubeseer.operator.config import GpuBackend
from kubeseer.placement import inventory as placement_inventory
from kubeseer.placement import plan, policy
from kubeseer.prediction import Prediction

Cond = dljob.ConditionType
Reason = dljob.Reason


def plan_fields(made: plan.Plan | None) -> dict[str, Any]:
    """`status.plan` for a plan (every candidate, ranked), nothing without one."""
    return {} if made is None else {"plan": plan.to_status(made)}


class Placer:
    """Chooses devices for attempts.

    Args:
        backend: free capacity, and where a choice is counted as taken.
        log: conditions and step timings.
        operator_metrics: placement counters.
        scheduler_name: the scheduler every attempt's pods name.
        open_kinds: that scheduler runs kubeseer's extender, which chooses among the kinds of
            the plan's ladder (`backends.Attempt.kinds`).
    """

    def __init__(
        self,
        backend: backends.Backend,
        log: journal.Journal,
        operator_metrics: metrics.OperatorMetrics,
        scheduler_name: str,
        *,
        open_kinds: bool = False,
    ) -> None:
        self.backend = backend
        self.log = log
        self.metrics = operator_metrics
        self.scheduler_name = scheduler_name
        self.open_kinds = open_kinds
        # Held from reading the inventory to recording the choice in it.
        self._lock = threading.Lock()

    def first(
        self, ref: dljob.DLJobRef, spec: dljob.DLJobSpec, prediction: Prediction
    ) -> tuple[backends.Attempt, st.Patch]:
        """Attempt 0's device; its patch moves the DLJob to Placed.

        Raises:
            journal.StepError: nothing can hold the job (with the plan), or the coverage asked
                for is not the predictor's.
        """
        with self.log.timed(metrics.ReconcileStep.PLACE), self._lock:
            try:
                decision = policy.decide(prediction, self.backend.snapshot(), spec.placement)
            except policy.NoFit as e:
                self.metrics.placements.labels(
                    profile=metrics.NO_PROFILE, outcome=metrics.PlacementOutcome.NO_FIT
                ).inc()
                raise journal.StepError(
                    Cond.PLACED, explain.NO_FIT_REASONS[e.cause], str(e), fields=plan_fields(e.plan)
                ) from e
            except policy.CoverageError as e:
                raise journal.StepError(
                    Cond.PLACED,
                    Reason.COVERAGE_UNAVAILABLE,
                    explain.coverage_advice(prediction, spec.placement),
                ) from e
            attempt = self._attempt(ref, spec, prediction, decision, 0)
        placement = decision.placement
        self.metrics.placements.labels(
            profile=workload.profile_label(placement), outcome=metrics.PlacementOutcome.PLACED
        ).inc()
        message = placement.reason
        replaced = workload.gpu_requests_replaced(spec.template)
        if replaced:
            message += f"; the template's own GPU requests ({', '.join(replaced)}) are replaced"
        patch = st.progress(
            dljob.Phase.PLACED,
            placement=st.build_placement_status(placement, 0),
            **plan_fields(decision.plan),
        ).then(self.log.conditions(self.log.condition(Cond.PLACED, True, Reason.PLACED, message)))
        return attempt, patch

    def after_oom(
        self,
        ref: dljob.DLJobRef,
        spec: dljob.DLJobSpec,
        prediction: Prediction,
        failed: st.PlacedAttempt,
    ) -> backends.Attempt:
        """The next attempt's device after attempt n ran out of memory: the plan again for
        clearly more memory than failed (`policy.escalate`).

        Raises:
            policy.NoFit: nothing larger exists.
        """
        with self._lock:
            decision = policy.escalate(
                failed.placement, self.backend.snapshot(), spec.placement, prediction
            )
            attempt = self._attempt(ref, spec, prediction, decision, failed.attempt + 1)
        self.metrics.placements.labels(
            profile=workload.profile_label(decision.placement),
            outcome=metrics.PlacementOutcome.ESCALATED,
        ).inc()
        return attempt

    def after_loss(
        self, ref: dljob.DLJobRef, spec: dljob.DLJobSpec, prediction: Prediction, lost: int
    ) -> backends.Attempt:
        """The next attempt's device after attempt `lost`'s workload went away unfinished.

        Raises:
            policy.NoFit, policy.CoverageError: nothing can hold the job now.
        """
        with self._lock:
            decision = policy.decide(prediction, self.backend.snapshot(), spec.placement)
            return self._attempt(ref, spec, prediction, decision, lost + 1)

    def move(
        self,
        ref: dljob.DLJobRef,
        spec: dljob.DLJobSpec,
        prediction: Prediction,
        placed: st.PlacedAttempt,
    ) -> backends.Attempt | None:
        """The same attempt on a device free now, for pods that wait unschedulable on the kind
        they were placed on; None when that kind has room for them (the scheduler binds them
        there) or nothing the plan allows is free.

        The plan is made again, as for a first placement (`policy.decide`), so a move goes to
        the cheapest free rung, never to one the DLJob's placement rules out.

        Raises:
            policy.NoFit, policy.CoverageError: nothing can hold the job now.
        """
        own = placed.placement
        with self._lock:
            free_now = self.backend.snapshot()
            if _room_for_own_pods(free_now, own, spec.replicas):
                return None
            decision = policy.decide(prediction, free_now, spec.placement)
            new, chosen = decision.placement, decision.plan.chosen
            if chosen is None or (chosen.candidate.free or 0) < spec.replicas:
                return None
            if (new.resource, new.product_label) == (own.resource, own.product_label):
                return None
            attempt = self._attempt(ref, spec, prediction, decision, placed.attempt)
        self.metrics.placements.labels(
            profile=workload.profile_label(new), outcome=metrics.PlacementOutcome.MOVED
        ).inc()
        return attempt

    def again(
        self,
        ref: dljob.DLJobRef,
        spec: dljob.DLJobSpec,
        prediction: Prediction,
        state: st.DLJobStatus,
        placed: st.PlacedAttempt,
    ) -> backends.Attempt:
        """An attempt placed before (by this run or an earlier one of the operator), whose
        workload may not exist yet; its plan is the one `status.plan` recorded."""
        attempt = backends.Attempt(
            ref,
            spec,
            prediction,
            placed,
            self.scheduler_name,
            recorded_plan=state.plan,
            open_kinds=self.open_kinds,
        )
        self.backend.assume(attempt)
        return attempt

    def _attempt(
        self,
        ref: dljob.DLJobRef,
        spec: dljob.DLJobSpec,
        prediction: Prediction,
        decision: policy.Decision,
        number: int,
    ) -> backends.Attempt:
        """The decided attempt, counted as taken in the backend's inventory."""
        attempt = backends.Attempt(
            ref,
            spec,
            prediction,
            st.PlacedAttempt(decision.placement, number),
            self.scheduler_name,
            plan=decision.plan,
            open_kinds=self.open_kinds,
        )
        self.backend.assume(attempt)
        return attempt

    def as_run(self, placed: st.PlacedAttempt, node: str) -> st.PlacedAttempt:
        """The attempt as it ran on `node`: the kind of the placement's resource there.

        With open kinds the scheduler may have bound the pod to a larger kind than the one
        placed (`backends.Attempt.kinds`); an escalation after an out-of-memory failure must
        grow from the memory that failed, and the attempt's record must name it. Unchanged when
        the node is unknown, offers no such resource, or the backend is DRA (whose placement is
        already the allocated device).
        """
        if not node or self.backend.kind is not GpuBackend.EXTENDED:
            return placed
        placement = placed.placement
        offer = next(
            (
                o
                for o in self.backend.snapshot().offers
                if o.node == node and o.resource == placement.resource
            ),
            None,
        )
        if offer is None or offer.product_label == placement.product_label:
            return placed
        ran = dataclasses.replace(
            placement,
            profile=offer.profile.name,
            gpu_product=offer.model_key,
            product_label=offer.product_label,
            usable_memory_bytes=offer.usable_memory_bytes,
            compute_share=offer.compute_share,
            node_hint=node,
        )
        return st.PlacedAttempt(ran, placed.attempt)


def _room_for_own_pods(
    free_now: placement_inventory.Inventory, own: policy.Placement, replicas: int
) -> bool:
    """Whether the placement's kind has units for the attempt's own pods: free units less
    those other waiting pods may take (its own pods are among the waiting)."""
    units = sum(
        o.free
        for o in free_now.offers
        if o.product_label == own.product_label and o.resource == own.resource
    )
    others = max(0, free_now.pending_units(own.product_label, own.resource) - replicas)
    return units - others >= replicas
