"""The GPU profiler DaemonSet agent: what each DLJob pod really used on its GPU.

`nvml` (every NVML call the agent makes), `cgroup` (process -> container -> pod), `attribution`
(GPU devices and processes -> DLJob pods, DRA claims included), `window` (per-pod peak and mean
with the warm-up excluded), `report` (the DLJob's `status.observed`), `kube` (the API calls),
`agent` (the sampling loop) and `commands` (`kubeseer profiler`); `standin` (NVML's documented
answers, for machines without a GPU) and `recording` (a driver's answers, recorded on a GPU and
replayed). Nothing here imports the predictor or torch: the agent runs in a small image on
every GPU node.
"""
