"""GPU and MIG specifications with a public source for every figure (no torch, no Kubernetes).

`gpus.lookup(name)` finds a GPU by table key, NVML name, GFD product label or placement
catalogue key; `mig.device(gpu, profile)` is a whole GPU or one MIG instance as the predictor
and the slowdown model see it. Sources: `sources.SOURCES`; the table is printed in
docs/dataset.md ("The hardware table").
"""
