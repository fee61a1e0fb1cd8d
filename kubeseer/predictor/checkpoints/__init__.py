"""Package data: the default predictor checkpoint (`default.pt`), see docs/accuracy.md."""
