"""ONNX model -> PerfGraph: the Graph Extractor of PerfSeer section 3.1.

The steps, each cheap enough for thousands of graphs per training run:

1. Read and hash the serialised model (the digest identifies it in caches and predictions),
   refuse oversized, empty, truncated or non-ONNX bytes, and refuse control flow. External
   weight data is never loaded: weights only matter through their shapes and element types.
2. Bind every symbolic input dimension (batch size, sequence length, image size) and run ONNX
   shape inference on a copy of the graph whose large initializers are replaced by typed graph
   inputs, so that inference never touches weight bytes.
3. Fold constant sub-graphs (initializers, `Constant`, `ConstantOfShape` of a constant shape,
   casts and transposes of weights): their outputs are weights of the operators that read them,
   not operators of their own, exactly as a runtime folds them before the first step.
4. Every remaining operator is a node and every activation tensor from its producer to a
   consumer is an edge; features follow `kubeseer.predictor.schema`, FLOPs follow
   `kubeseer.predictor.opcount`.

docs/perfgraph.md documents every feature, the shape mapping and the error types.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx

from kubeseer.predictor import errors, perfgraph
from kubeseer.predictor.extract import binding, features, load, rebatch, structure


def from_onnx(
    source: load.Source,
    *,
    batch_size: int,
    inputs: Mapping[str, int] | None = None,
    max_bytes: int = load.DEFAULT_MAX_BYTES,
) -> perfgraph.PerfGraph:
    """Extract the PerfGraph of an ONNX model at a batch size.

    Args:
        source: a path to an ``.onnx`` file, its bytes, or a parsed `onnx.ModelProto`.
            External data files are never opened.
        batch_size: bound to every input dimension named like a batch
            (`binding.BATCH_DIM_NAMES`) and to every symbolic first dimension of a graph input;
            a model exported with a fixed batch size is rebound to it where its graph follows
            (`rebatch`).
        inputs: other symbolic dimensions by name, e.g. ``{"seq": 128}``.
        max_bytes: refuse serialised models larger than this.

    Raises:
        errors.GraphError: a subclass naming what is wrong with the model or the bindings.

    Warns:
        errors.UnknownOperatorWarning: once, listing operator types counted as zero FLOPs.
        errors.FixedBatchWarning: once, when a fixed batch size was rebound.
    """
    if batch_size < 1:
        raise errors.BindingError(f"batch size must be at least 1, got {batch_size}")
    with load.serialised(source, max_bytes) as data:
        digest = load.Digest(data)
        try:
            model = source if isinstance(source, onnx.ModelProto) else load.parse(data)
            model, nodes = structure.check(model)
            bound = binding.bind_inputs(model.graph, batch_size, dict(inputs or {}))
            table = rebatch.infer(model, nodes, bound)
            return features.build(model.graph, nodes, table, digest=digest, batch_size=batch_size)
        finally:
            digest.wait()  # the hashing thread reads `data`, which closes after this block
