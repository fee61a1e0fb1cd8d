"""The DLJob operator: kopf handlers over a small state machine.

`dljob` (the resource as typed values), `workload` and `status` (pure builders), `pods` (what
became of a workload), `reconcile` (the state machine), `kube`/`models` (the API server and model
sources), `handlers` (kopf shells), `main` (the composition root) and `commands`
(`kubeseer operator run`). Modules are imported by name so that `kubeseer --help` stays light.
"""
