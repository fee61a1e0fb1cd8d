"""The measured performance dataset: plans, the harness, Parquet storage and the CLI.

Only torch, numpy, pyarrow, pyyaml, rich, pynvml and the standard library are imported here,
because the harness runs on bare GPU images with nothing but `PYTHONPATH=.`. The predictor reads
the data through `storage.read_records`; everything else is private to this package.
"""
