"""PerfGraphs as files in the observation store, so that observations can be trained on later.

An observation names its model by sha256; the ONNX file may be gone by the time anyone
retrains (a URL that moved, a ConfigMap that was deleted). The PerfGraph is what training
needs, and it is small (numbers per operator, no weights), so the operator stores it once per
(model, bindings, batch) beside the observations. The file is a NumPy ``.npz`` archive of the
graph's arrays plus its metadata as JSON; it carries the PerfGraph schema version, and a graph
of another version is refused rather than misread.
"""

from __future__ import annotations

import io
import json

import numpy as np

from kubeseer.predictor import perfgraph, schema


class GraphFileError(ValueError):
    """A stored PerfGraph that cannot be read back (damaged, or another schema version)."""


def to_bytes(graph: perfgraph.PerfGraph) -> bytes:
    """The graph as an ``.npz`` archive."""
    metadata = {
        "op_types": list(graph.op_types),
        "node_names": list(graph.node_names),
        "schema_version": graph.schema_version,
        "model_digest": graph.model_digest,
        "batch_size": graph.batch_size,
        "flops": graph.flops,
        "params": graph.params,
        "mac": graph.mac,
        "unknown_ops": list(graph.unknown_ops),
        "output_ranks": list(graph.output_ranks),
        "broadcast_copies": list(graph.broadcast_copies),
        "scopes": list(graph.scopes),
    }
    sink = io.BytesIO()
    np.savez_compressed(
        sink,
        node_features=graph.node_features,
        edge_index=graph.edge_index,
        edge_features=graph.edge_features,
        global_features=graph.global_features,
        metadata=np.array(json.dumps(metadata)),
    )
    return sink.getvalue()


def from_bytes(data: bytes) -> perfgraph.PerfGraph:
    """Inverse of `to_bytes`.

    Raises:
        GraphFileError: not such an archive, or a graph of another schema version.
    """
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            metadata = json.loads(str(archive["metadata"]))
            arrays = {
                name: np.array(archive[name])
                for name in ("node_features", "edge_index", "edge_features", "global_features")
            }
    except (OSError, ValueError, KeyError) as e:
        raise GraphFileError(f"not a stored PerfGraph: {e}") from e
    if metadata.get("schema_version") != schema.SCHEMA_VERSION:
        raise GraphFileError(
            f"PerfGraph schema {metadata.get('schema_version')!r}, this reader understands "
            f"{schema.SCHEMA_VERSION}"
        )
    try:
        return perfgraph.PerfGraph(
            node_features=arrays["node_features"],
            edge_index=arrays["edge_index"],
            edge_features=arrays["edge_features"],
            global_features=arrays["global_features"],
            op_types=tuple(metadata["op_types"]),
            node_names=tuple(metadata["node_names"]),
            schema_version=int(metadata["schema_version"]),
            model_digest=str(metadata["model_digest"]),
            batch_size=int(metadata["batch_size"]),
            flops=int(metadata["flops"]),
            params=int(metadata["params"]),
            mac=int(metadata["mac"]),
            unknown_ops=tuple(metadata["unknown_ops"]),
            output_ranks=tuple(int(rank) for rank in metadata.get("output_ranks", ())),
            broadcast_copies=tuple(int(n) for n in metadata.get("broadcast_copies", ())),
            scopes=tuple(str(scope) for scope in metadata.get("scopes", ())),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise GraphFileError(f"stored PerfGraph does not hold together: {e}") from e
