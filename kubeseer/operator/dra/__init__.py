"""The operator's Dynamic Resource Allocation backend, in plain Python (docs/dra.md).

* `inventory`: the free devices, read from the DRA driver's ResourceSlices minus what
  ResourceClaims hold (shared counters included), as the `Inventory` placement plans on.
* `ladder`: the ResourceClaimTemplate of one attempt, the plan's ladder as `firstAvailable`.
* `allocation`: what the scheduler allocated, written back into the DLJob's status.
"""
