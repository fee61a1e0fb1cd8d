"""A real local Kubernetes control plane for end-to-end tests and the demo.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler are built from their Go modules
by `hack/build-control-plane.sh`; KWOK plays the kubelets of fake GPU nodes described in
`deploy/devcluster/nodes.yaml`. Entry points: `cluster.LocalCluster` and
`kubeseer devcluster up|down|status` (`commands`). Modules are imported by name
(`from kubeseer.devcluster import cluster`) so that `kubeseer --help` stays light.
"""
