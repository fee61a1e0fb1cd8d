"""The graph cache's revision moves with what extraction makes of a spec.

`dataset.GRAPH_REVISION` names the cache directory. A change to the zoo's export, to extraction
or to `analytic_memory.from_perfgraph` that leaves it alone lets every training read graphs made
by the old code; revision 1 was such a cache (memory graphs that counted a tied embedding
twice). This test fingerprints what the current code makes of four reference models and
fails, naming the new fingerprint, until the revision is bumped with it.

The rules: bump the revision when any graph the dataset can cache changes. A refactor that
leaves every graph byte-identical keeps it (splitting `extract.py` into the `extract/`
package was checked on 159 graphs, 44 zoo exports and the `onnx` package's light models at
batch 1, 8 and 64, before and after). So does a change that only gives graphs to models that
used to be refused (a fixed batch dimension rebound, exporter dimensions resolved), since no
cached graph came from them; the fingerprint below then stays as it is, which is the check.
"""

import hashlib
import json

import numpy as np

from kubeseer.predictor import analytic_memory, dataset

# A token model with a tied output projection and dropout, a convolutional net with folded
# BatchNorms, an MLP, and a Llama (rotary positions, whose Split the dynamo exporter writes
# without a module path), so that the fingerprint sees weights, activations, shapes and module
# paths of each kind.
REFERENCE_SPECS = (
    {"family": "bert", "arch": {"layers": 1, "hidden": 16, "heads": 2, "ffn": 32,
     "max_positions": 32, "type_vocab": 2}, "input": {"seq_len": 16, "vocab_size": 256}},
    {"family": "resnet", "arch": {"block": "basic", "groups": 1, "layers": [1, 1],
     "num_classes": 10, "stem_width": 8, "width_per_group": 64, "widths": [8, 16]},
     "input": {"channels": 3, "image_size": 32}},
    {"family": "llama", "arch": {"layers": 1, "hidden": 16, "heads": 2, "kv_heads": 1, "ffn": 32,
     "max_positions": 16, "tie_embeddings": False}, "input": {"seq_len": 16, "vocab_size": 64}},
    {"family": "mlp", "arch": {"activation": "gelu", "hidden": [32], "norm": "batch",
     "num_classes": 4}, "input": {"features": 12}},
)  # fmt: skip
BATCH_SIZES = (1, 3)

# (revision, fingerprint): bump both together.
EXPECTED = (9, "d02b53e53592195d")


def fingerprint() -> str:
    digest = hashlib.sha256()
    for spec in REFERENCE_SPECS:
        for batch, graph in sorted(
            dataset.export_perfgraphs(json.dumps(spec), BATCH_SIZES).items()
        ):
            arrays = (
                graph.node_features,
                graph.edge_index,
                graph.edge_features,
                graph.global_features,
            )
            for array in arrays:
                digest.update(np.ascontiguousarray(array).tobytes())
            memory_graph = analytic_memory.from_perfgraph(graph).to_dict()
            meta = [batch, graph.op_types, graph.params, graph.flops, graph.mac, memory_graph]
            digest.update(json.dumps(meta, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def test_the_cache_revision_names_what_extraction_makes_of_the_reference_models():
    found = (dataset.GRAPH_REVISION, fingerprint())
    assert found == EXPECTED, (
        f"(revision, fingerprint) is {found}, recorded {EXPECTED}. When the graphs changed, "
        f"bump dataset.GRAPH_REVISION to {EXPECTED[0] + 1} and record "
        f"({EXPECTED[0] + 1}, {found[1]!r}) here"
    )
