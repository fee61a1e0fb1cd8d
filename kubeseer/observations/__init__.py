"""Observations: every finished DLJob attempt, kept as training data, and bounds that learn.

`record` (the `Observation` value and its versioned Arrow schema), `store` (a Parquet dataset
on a directory or an S3-compatible bucket that survives DLJob deletion and operator restarts),
`recalibration` (calibrated memory margins updated online from the cluster's own observations),
`feedback` (an attempt's status -> an observation, error metrics, the store and the margins in
one idempotent call, for the operator) and `pull` (`kubeseer dataset pull`: observations -> the
measured-dataset format that `kubeseer train --init` reads). Only `pull` and `graphs` import the
predictor; the rest is plain Python, pyarrow and prometheus_client.
"""
