r"""The PerfGraph :math:`G = (\mathbf{u}, V, E)` of PerfSeer section 3.1, as plain numpy arrays.

`PerfGraph` is what crosses from graph extraction (`kubeseer.predictor.extract`) to the models:
raw feature values in the units of `kubeseer.predictor.schema`, so that a cached graph can be
re-transformed if the transform changes. `to_pyg` applies the documented transform and builds
the `torch_geometric.data.Data` the models read; torch and torch-geometric are imported only
there, because importing torch-geometric costs seconds that extraction alone never needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from kubeseer.predictor import eager, schema

if TYPE_CHECKING:
    from torch_geometric.data import Data

FloatArray = npt.NDArray[np.float64]
IndexArray = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class PerfGraph:
    """One ONNX model at one batch size, as nodes, edges and global features.

    Arrays are read-only; shapes are in :math:`N_v` nodes, :math:`N_e` edges and the schema's
    feature counts.

    Attributes:
        node_features: ``(Nv, len(schema.NODE_FEATURES))`` raw node features.
        edge_index: ``(2, Ne)`` producer (row 0) and consumer (row 1) node indices.
        edge_features: ``(Ne, len(schema.EDGE_FEATURES))`` raw edge features.
        global_features: ``(len(schema.GLOBAL_FEATURES),)`` raw global features.
        op_types: ONNX operator type of each node (metadata only, never a feature).
        node_names: ONNX node name of each node (``"{op_type}_{index}"`` when unnamed).
        schema_version: `schema.SCHEMA_VERSION` the graph was extracted with.
        model_digest: hex sha256 of the serialised ONNX model.
        batch_size: the batch size bound at extraction.
        flops: total FLOPs of all nodes.
        params: elements of the distinct weight tensors (a tied weight counts once).
        mac: total memory access cost of all nodes, in bytes.
        unknown_ops: operator types counted as zero FLOPs for lack of a formula.
        output_ranks: dimensions of each node's first output (metadata, never a feature: the
            (B, C, H, W) mapping folds ranks above four, and fused attention takes only
            four-dimensional operands); empty for a graph stored before ranks were kept.
        broadcast_copies: elements each node's `torch.matmul` copies its operands into where
            their batch dimensions broadcast (`extract.features.broadcast_copy_elements`), 0
            for other nodes; empty for a graph stored before they were counted.
        scopes: the module path each node ran under (`extract.scopes.module_path`), ``""``
            where the file does not say; empty for a graph stored before paths were read
            from anything but node names (`scope_of` then reads them from `node_names`).
    """

    node_features: FloatArray
    edge_index: IndexArray
    edge_features: FloatArray
    global_features: FloatArray
    op_types: tuple[str, ...]
    node_names: tuple[str, ...]
    schema_version: int
    model_digest: str
    batch_size: int
    flops: int
    params: int
    mac: int
    unknown_ops: tuple[str, ...] = ()
    output_ranks: tuple[int, ...] = ()
    broadcast_copies: tuple[int, ...] = ()
    scopes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        nv, ne = len(self.op_types), self.edge_index.shape[1] if self.edge_index.ndim == 2 else -1
        expected = {
            "node_features": (nv, len(schema.NODE_FEATURES)),
            "edge_index": (2, ne),
            "edge_features": (ne, len(schema.EDGE_FEATURES)),
            "global_features": (len(schema.GLOBAL_FEATURES),),
        }
        for name, shape in expected.items():
            array: npt.NDArray[np.generic] = getattr(self, name)
            if array.shape != shape:
                raise ValueError(f"{name} has shape {array.shape}, expected {shape}")
            array.flags.writeable = False
        if len(self.node_names) != nv:
            raise ValueError(f"{len(self.node_names)} node names for {nv} nodes")
        if self.output_ranks and len(self.output_ranks) != nv:
            raise ValueError(f"{len(self.output_ranks)} output ranks for {nv} nodes")
        if self.broadcast_copies and len(self.broadcast_copies) != nv:
            raise ValueError(f"{len(self.broadcast_copies)} broadcast copies for {nv} nodes")
        if self.scopes and len(self.scopes) != nv:
            raise ValueError(f"{len(self.scopes)} module paths for {nv} nodes")

    def scope_of(self, node: int) -> str:
        """The module path `node` ran under, ``""`` when unknown."""
        return self.scopes[node] if self.scopes else eager.scope_of(self.node_names[node])

    @property
    def num_nodes(self) -> int:
        """Number of operators :math:`N_v`."""
        return len(self.op_types)

    @property
    def num_edges(self) -> int:
        """Number of producer-to-consumer tensor edges :math:`N_e`."""
        return int(self.edge_index.shape[1])

    def global_dict(self) -> dict[str, float]:
        """Global features by name, raw values (for reports and JSON)."""
        return {
            name: float(value)
            for name, value in zip(schema.GLOBAL_FEATURES, self.global_features, strict=True)
        }


def _log1p_columns(features: tuple[schema.Feature, ...]) -> npt.NDArray[np.bool_]:
    return np.array([f.transform is schema.Transform.LOG1P for f in features], dtype=bool)


_NODE_LOG = _log1p_columns(schema.NODE_SCHEMA)
_EDGE_LOG = _log1p_columns(schema.EDGE_SCHEMA)
_GLOBAL_LOG = _log1p_columns(schema.GLOBAL_SCHEMA)


def transform(values: FloatArray, log_columns: npt.NDArray[np.bool_]) -> FloatArray:
    """Apply log1p to the magnitude columns and leave the others as they are.

    Magnitudes span ten decades (a Relu's 10^5 FLOPs against a model's 10^12); log1p makes
    them comparable while keeping 0 at 0.
    """
    out = np.array(values, dtype=np.float64, copy=True)
    out[..., log_columns] = np.log1p(out[..., log_columns])
    return out


def to_pyg(graph: PerfGraph) -> Data:
    """The graph as a `torch_geometric.data.Data` with transformed float32 features.

    Shapes: ``x (Nv, Dv)``, ``edge_index (2, Ne)`` int64, ``edge_attr (Ne, De)``,
    ``u (1, Dg)`` (one row, so that a `Batch` of graphs stacks to ``(B, Dg)``).
    """
    import torch
    from torch_geometric.data import Data

    x = transform(graph.node_features, _NODE_LOG)
    edge_attr = transform(graph.edge_features, _EDGE_LOG)
    u = transform(graph.global_features, _GLOBAL_LOG)
    return Data(
        x=torch.from_numpy(x.astype(np.float32)),
        edge_index=torch.from_numpy(np.array(graph.edge_index, dtype=np.int64, copy=True)),
        edge_attr=torch.from_numpy(edge_attr.astype(np.float32)),
        u=torch.from_numpy(u.astype(np.float32)).reshape(1, -1),
        num_nodes=graph.num_nodes,
    )
