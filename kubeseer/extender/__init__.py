"""kube-scheduler extender for device-plugin GPU clusters (`kubeseer extender`).

Filters nodes whose free GPU or MIG units, allowed product or usable memory per unit cannot hold
a kubeseer pod's predicted peak, and scores the rest by best fit that keeps big slices whole.

Modules, imported by name: `wire` (the extender protocol's JSON), `pods` and `nodes` (what is
read from a Pod and a Node), `decide` (filter and prioritize as pure functions), `cache`
(watch-fed state), `informer` and `kube` (list-then-watch loops), `server` (HTTP), `stanza`
(the scheduler configuration entry), `service` (composition root), `commands` (CLI).
"""
