"""The devices NVIDIA's DRA driver (`gpu.nvidia.com`) would publish for the fake GPU nodes.

A DRA node has no `nvidia.com/*` extended resources: its GPUs reach the scheduler as
ResourceSlices, shaped as `kubernetes-sigs/dra-driver-nvidia-gpu`'s kubelet plugin publishes
them, so the real kube-scheduler allocates ResourceClaims against them. This is the one fake of
the DRA path and it fakes only what a node agent publishes; nothing here allocates anything.

* `geometry`: NVIDIA's MIG placement rules (which memory slices each profile may start at).
* `slices`: the ResourceSlices of a node, static MIG (pre-made partitions) or dynamic MIG
  (every placement, with shared counters), as pure builders.
* `publish`: creating them, and the driver's DeviceClasses, in a running cluster.
* `allocation`: reading what the scheduler allocated back from ResourceClaims and checking it
  against the slices' counters (tests, the benchmark).
"""
