"""Why the predictor could not answer: the request, the model's graph, or the checkpoint.

Every failure of the predictor is a `PredictionError`; a `GraphError` says the ONNX model could
not become a PerfGraph. The operator turns a `GraphError` into a permanent failure of the DLJob
(the model will not get better by retrying), so every subclass names the model-side problem and
what to change, never a stack trace from protobuf or the shape inferencer. Third-party
exceptions are chained with ``raise ... from``.
"""

from __future__ import annotations


class PredictionError(Exception):
    """A request the predictor cannot answer (model unreadable, metric never learned, ...)."""


class GraphError(PredictionError):
    """An ONNX model that cannot be turned into a PerfGraph."""


class NotOnnxError(GraphError):
    """The bytes are empty, truncated, or not an ONNX `ModelProto` at all."""


class ModelTooLargeError(GraphError):
    """The serialised model exceeds the size limit, so parsing it is refused outright."""


class ControlFlowError(GraphError):
    """The graph holds `If`, `Loop`, `Scan` or another operator with a sub-graph.

    A PerfGraph is a static data-flow graph; which branch runs, or how often a loop body runs,
    is only known at run time.
    """


class UnsupportedOperatorError(GraphError):
    """An operator of a custom domain whose output shapes nothing declares, so they cannot be
    inferred (the exporter's `value_info` is the only source of a custom operator's shapes)."""


class BindingError(GraphError):
    """The requested batch size or dimension bindings do not fit the model's inputs."""


class SymbolicDimensionError(GraphError):
    """A tensor dimension is still symbolic after binding the batch size and `inputs`."""


class ShapeInferenceError(GraphError):
    """ONNX shape inference rejected the graph or left a tensor without a shape."""


class MalformedGraphError(GraphError):
    """The graph is structurally broken: a node reads a tensor that nothing provides."""


class ExtractionWarning(UserWarning):
    """Extraction succeeded with something the user should know (one warning per graph)."""


class UnknownOperatorWarning(ExtractionWarning):
    """Some operators have no FLOP formula and were counted as zero-cost.

    A warning rather than an error: the rest of the graph (shapes, bytes, topology) is still
    right, and custom operators are common in exported models.
    """


class FixedBatchWarning(ExtractionWarning):
    """The model was exported with a fixed batch size and was rebound to the requested one."""
