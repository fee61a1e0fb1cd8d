"""The PerfGraph value, its PyG conversion, and the schema's documentation."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch_geometric.data import Batch

from kubeseer.predictor import extract, perfgraph, schema

DOCS = Path(__file__).resolve().parents[3] / "docs" / "perfgraph.md"
SQUEEZENET = Path(onnx.__file__).parent / "backend/test/data/light/light_squeezenet.onnx"
DV, DE, DG = len(schema.NODE_FEATURES), len(schema.EDGE_FEATURES), len(schema.GLOBAL_FEATURES)


def two_nodes(**overrides) -> perfgraph.PerfGraph:
    """Node 0 -> node 1 over one edge; feature values 0..n so every column is distinct."""
    fields = {
        "node_features": np.arange(2 * DV, dtype=np.float64).reshape(2, DV) / 7,
        "edge_index": np.array([[0], [1]], dtype=np.int64),
        "edge_features": np.array([[4096.0, 2, 8, 16, 1]]),
        "global_features": np.arange(DG, dtype=np.float64),
        "op_types": ("MatMul", "Relu"),
        "node_names": ("mm", "act"),
        "schema_version": schema.SCHEMA_VERSION,
        "model_digest": "0" * 64,
        "batch_size": 2,
        "flops": 10,
        "params": 3,
        "mac": 20,
    }
    return perfgraph.PerfGraph(**(fields | overrides))


def expected_transform(raw: np.ndarray, features: tuple[schema.Feature, ...]) -> torch.Tensor:
    columns = [
        np.log1p(raw[..., i]) if f.transform is schema.Transform.LOG1P else raw[..., i]
        for i, f in enumerate(features)
    ]
    return torch.tensor(np.stack(columns, axis=-1), dtype=torch.float32)


def test_to_pyg_applies_log1p_to_magnitudes_only():
    graph = two_nodes()
    data = perfgraph.to_pyg(graph)
    torch.testing.assert_close(data.x, expected_transform(graph.node_features, schema.NODE_SCHEMA))
    torch.testing.assert_close(
        data.edge_attr, expected_transform(graph.edge_features, schema.EDGE_SCHEMA)
    )
    torch.testing.assert_close(
        data.u, expected_transform(graph.global_features[None, :], schema.GLOBAL_SCHEMA)
    )
    share = schema.NODE_FEATURES.index("flops_share")
    assert data.x[1, share].item() == pytest.approx(graph.node_features[1, share])
    torch.testing.assert_close(data.edge_index, torch.tensor([[0], [1]]))


def test_to_pyg_shapes_and_dtypes_batch_into_one_row_of_globals_per_graph():
    data = perfgraph.to_pyg(extract.from_onnx(SQUEEZENET, batch_size=1))
    nv, ne = data.num_nodes, data.edge_index.shape[1]
    assert data.x.shape == (nv, DV) and data.x.dtype == torch.float32
    assert data.edge_attr.shape == (ne, DE) and data.edge_index.dtype == torch.int64
    assert data.u.shape == (1, DG)
    batch = Batch.from_data_list([data, perfgraph.to_pyg(two_nodes())])
    assert batch.u.shape == (2, DG)
    assert batch.x.shape == (nv + 2, DV)


def test_perfgraph_arrays_are_read_only():
    graph = two_nodes()
    with pytest.raises(ValueError, match="read-only"):
        graph.node_features[0, 0] = 1.0


@pytest.mark.parametrize(
    "overrides",
    [
        {"node_features": np.zeros((3, DV))},
        {"edge_features": np.zeros((1, DE + 1))},
        {"global_features": np.zeros(DG - 1)},
        {"node_names": ("mm",)},
    ],
)
def test_perfgraph_rejects_arrays_that_disagree_with_the_schema(overrides):
    with pytest.raises(ValueError):
        two_nodes(**overrides)


def doc_table(heading: str) -> list[tuple[str, ...]]:
    section = DOCS.read_text(encoding="utf-8").split(heading, 1)[1]
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \| ([^|]+) \| (\w+) \| ([^\n]+) \|$", section, re.M)
    out = []
    for expected_index, row in enumerate(rows):
        if int(row[0]) != expected_index:  # the next table after this heading starts
            break
        out.append(tuple(cell.strip() for cell in row[1:]))
    return out


@pytest.mark.parametrize(
    ("heading", "features"),
    [
        ("## Node features", schema.NODE_SCHEMA),
        ("## Edge features", schema.EDGE_SCHEMA),
        ("## Global features", schema.GLOBAL_SCHEMA),
    ],
)
def test_docs_list_every_feature_in_schema_order(heading, features):
    expected = [(f.name, f.unit, f.transform.value, f.description) for f in features]
    assert doc_table(heading) == expected


def test_extraction_never_imports_torch_geometric():
    code = "import sys, kubeseer.predictor.extract; print('torch_geometric' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
