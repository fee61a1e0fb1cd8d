"""kubeseer: predict a deep-learning job's GPU needs from its ONNX graph and place it to fit."""

__version__ = "0.1.0"
