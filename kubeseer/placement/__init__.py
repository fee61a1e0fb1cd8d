"""GPU and MIG placement: catalogue, free inventory and policy (no torch, no Kubernetes)."""
