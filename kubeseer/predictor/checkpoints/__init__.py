"""Package data: the predictor checkpoints shipped by name (`api.SHIPPED_CHECKPOINTS`):
`default.pt` (GPU labels) and `cpu-amd-epyc.pt` (CPU labels), see docs/accuracy.md."""
