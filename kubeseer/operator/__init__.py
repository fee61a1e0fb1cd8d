"""The DLJob operator: kopf handlers over a small state machine.

`dljob` (the resource as typed values), `workload` and `status` (pure builders), `pods` (what
became of a workload), `reconcile` (the state machine, with `placing`, `launch`, `outcomes`,
`allocations`, `journal`, `explain` and its `ports`), `backends` and `dra` (how pods get their
GPU: extended resources or Dynamic Resource Allocation), `checkpoints` (a predictor checkpoint
swapped while running), `kube`/`models` (the API server and model sources), `handlers` (kopf
shells), `main` (the composition root) and `commands` (`kubeseer operator run`). Modules are
imported by name so that `kubeseer --help` stays light.
"""
