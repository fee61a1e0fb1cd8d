"""Analytic peak-memory estimator: what a job must hold, term by term, from the graph alone.

Source: the analytic approach of DNNMem (Gao et al., *Estimating GPU Memory Consumption of Deep
Learning Models*, ESEC/FSE 2020), which DIPPM and DNNPerf cite as the non-learned alternative:
sum the tensors the framework keeps (weights, gradients, optimiser state, activations), walk the
operator graph in execution order to find which activations are alive together, and add what the
runtime holds regardless of the model (CUDA context, cuBLAS/cuDNN workspace).

It is production code: every memory prediction stands on it (the learned model predicts a
correction to this estimate, `kubeseer.predictor.prior`; the served figure never falls below
the state it counts, and far beyond the training labels it is the figure), and it is the
non-learned baseline the learned predictors are measured against. Its known blind spots are the
reason the project labels with measured memory (DNNPerf's threats section; PerfSeer): the
caching allocator's fragmentation, algorithm-dependent workspace, and operators whose saved
tensors differ from the rules below. Where ONNX spells out what PyTorch runs as one fused
kernel, the fused form is modelled: ``Linear`` as MatMul + bias Add, exact GELU as Div, Erf,
Add and two Muls in any of the exporters' three orders; other decompositions (tanh-GELU,
hand-written normalisations) are counted op by op. Where ONNX leaves out what PyTorch runs, it
is added back: the BatchNorm an eval export folds into each convolution (`FOLDS_NORMALISATION`)
and, when training, the cross-entropy loss on the graph's outputs. Attention is counted as
written, its ``(B, heads, S, S)`` scores and probabilities stored: ONNX spells
``scaled_dot_product_attention`` and hand-written attention alike, the zoo that labels the
predictor writes attention out (docs/zoo.md), and where a job does run a fused kernel the
estimate errs towards more memory, the safe side for placement. `calibrate` fits the runtime
constant on measured data to absorb the part of the error that does not depend on the model.

Model of one step, in bytes (``align`` rounds each tensor up to the allocator's block size):

- weights: every parameter in fp32 (fp16/bf16 jobs are autocast over fp32 weights).
- weight copies (inference): autocast's low-precision cast of one matrix operator's weights at
  a time. When training, each cast is saved for the operator's backward, with the activations.
- gradients (train): one fp32 gradient per parameter, all alive at the optimiser step.
- optimiser state (train): 2 per parameter for Adam/AdamW, 1 for SGD with momentum, 0 for SGD.
- batch: the graph input, held for the whole step.
- activations: for inference, the peak of the tensors alive together during a forward pass in
  topological order (a tensor lives from its producer until its last consumer; view operators
  share their input's storage). For training, the peak of three phases walked operator by
  operator, less the gradients term: the forward pass with the tensors autograd saves kept
  alive; backward in reverse order, freeing each saved tensor after the first operator that
  saved it while activation gradients come and go and parameter gradients accumulate; and the
  optimiser step, which holds every gradient and its own temporaries (`DeviceProfile`). A
  training step starts without gradients (``zero_grad(set_to_none=True)``, PyTorch's default).
  Against the CPU allocator peaks of 1,126 zoo training steps this is 2.6 % off on average,
  where counting every gradient and every saved tensor at once was 12.2 %.
- workspace and CUDA context: per-device constants (`DeviceProfile`).
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

import numpy as np

from kubeseer import units
from kubeseer.prediction import Attention, Mode, Precision
from kubeseer.predictor import attention, autocast, eager, perfgraph, schema

#: Operators whose output is a view of their first input in PyTorch: no new storage.
VIEW_OPS: Final[frozenset[str]] = frozenset(
    {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"}
)

#: Read as run (every `Rules` after ``written``) also ``Expand``: PyTorch's ``expand`` is a
#: stride-0 view, where ONNX's Expand writes the broadcast out.
RUNTIME_VIEW_OPS: Final[frozenset[str]] = VIEW_OPS | {"Expand"}

#: Read eagerly (`Rules.EAGER`) at inference also ``Slice``: indexing a range (``x[:, :c]``,
#: ``narrow``) is a strided view in PyTorch, which keeps the whole tensor it views alive
#: (GhostNet returns a slice of its concatenation). Training keeps reading it as a copy: a
#: zoo ViT's measured training peak is 5 % under that reading and 8 % under the view's.
EAGER_VIEW_OPS: Final[frozenset[str]] = RUNTIME_VIEW_OPS | {"Slice"}

#: Read eagerly (`Rules.EAGER`): the operator an exporter writes for an assignment to an indexed
#: region (``x[:, :, 1:, 1:] = y``, ``index_put_``). Eager PyTorch copies into a view of ``x`` in
#: place, so the output is ``x``'s storage, and the slice needs no index tensor; ONNX writes one
#: int64 coordinate tuple per element assigned (MViTv2's relative-position attention: 30 GB at
#: batch 768, more than the job's whole peak). Read only where data, indices and updates are all
#: computed (`_index_assignments`).
INDEX_ASSIGNMENT_OPS: Final[frozenset[str]] = frozenset({"ScatterND"})

#: View operators that make a new tensor when training: dropout returns its input unchanged in
#: eval mode, and in training writes a masked copy and keeps the mask for backward.
TRAINING_ONLY_VIEW_OPS: Final[frozenset[str]] = frozenset({"Dropout"})

#: Operators whose backward reads their activation inputs, so autograd saves them.
SAVES_INPUTS: Final[frozenset[str]] = frozenset(
    {
        "Conv",
        "ConvTranspose",
        "Gemm",
        "MatMul",
        "BatchNormalization",
        "LayerNormalization",
        "InstanceNormalization",
        "GroupNormalization",
        "Mul",
        "Div",
        "Pow",
        "Gelu",
        "Erf",
        "MaxPool",
        "Softplus",
        "HardSwish",
        "HardSigmoid",
        "LeakyRelu",
        "PRelu",
        "Clip",
        "Where",
        "Gather",
        "ReduceMax",
        "ReduceMin",
        "ReduceL2",
        "Log",
    }
)

#: Products whose backward for one operand reads only the others (``d(a*b)/da = b``), so
#: autograd saves an operand only when another one needs a gradient (read eagerly).
OPERAND_PRODUCTS: Final[frozenset[str]] = frozenset({"Mul", "MatMul", "Gemm"})

#: What computes a table from positions (`_computes_tables`): arithmetic, whose initializers
#: are constants (inverse frequencies) ...
TABLE_ARITHMETIC: Final[frozenset[str]] = frozenset(
    {"Cast", "Mul", "Div", "Add", "Sub", "Neg", "Pow", "Sqrt", "Reciprocal", "Exp", "MatMul"}
    | {"Sin", "Cos"}
)

#: ... and layout, which keeps a table a table unless it moves a weight (a Slice of a learned
#: position table is that table, and a Gather from one is no layout at all).
TABLE_LAYOUT: Final[frozenset[str]] = frozenset(
    {"Concat", "Split", "Slice", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand"}
    | {"Transpose", "Identity"}
)

#: Operators whose backward reads their own output (ReLU's mask, softmax's probabilities ...).
SAVES_OUTPUT: Final[frozenset[str]] = frozenset(
    {"Relu", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "Exp", "Sqrt", "Elu", "Selu"}
)

#: Operators whose backward needs neither inputs nor outputs (shapes only). Anything not in one
#: of these three sets is assumed to save its inputs, which errs towards more memory.
SAVES_NOTHING: Final[frozenset[str]] = frozenset(
    {
        "Add",
        "Sub",
        "Neg",
        "Concat",
        "Split",
        "Slice",
        "Pad",
        "Transpose",
        "Cast",
        "Expand",
        "Tile",
        "AveragePool",
        "GlobalAveragePool",
        "ReduceMean",
        "ReduceSum",
        "Shape",
        "Constant",
        "ConstantOfShape",
        "Range",
        "Equal",
        "Less",
        "Greater",
        "Not",
        "And",
        "Or",
        "Trilu",
    }
    | VIEW_OPS
)

#: Operators whose backward reads only their inputs that carry no gradient: Where routes the
#: gradient by its condition, a mask, and needs neither branch.
SAVES_MASK_INPUTS: Final[frozenset[str]] = frozenset({"Where"})

#: Operators whose outputs carry no gradient (shapes, indices, comparisons): backward never
#: makes one for them or for what is computed from them alone.
NO_GRADIENT_OPS: Final[frozenset[str]] = frozenset(
    {
        "Shape",
        "Size",
        "Constant",
        "ConstantOfShape",
        "Range",
        "Equal",
        "Less",
        "LessOrEqual",
        "Greater",
        "GreaterOrEqual",
        "Not",
        "And",
        "Or",
        "ArgMax",
        "ArgMin",
        "NonZero",
        "IsNaN",
        "IsInf",
    }
)

#: Operators that an ONNX file exported for inference may carry a BatchNormalization folded into
#: (exporters fold it into the preceding convolution's weights and bias). The file cannot say
#: whether one was folded; nearly every convolution of today's CNNs is followed by one, and
#: assuming one errs towards more memory. PyTorch runs it as its own operator: its input is a
#: second tensor the size of the output, alive while it runs and, when training, saved for
#: its backward. Counting them took the training estimate's mean error on the CPU peaks of the
#: zoo's seven CNN families from 8-28 % to 0.6-6 % (vgg, whose zoo has convolutions with and
#: without BatchNorm, is the 6 %).
FOLDS_NORMALISATION: Final[frozenset[str]] = frozenset({"Conv"})

#: Activations PyTorch can apply in place, as timm's norm-act layers do (their ``inplace=True``
#: passed to ReLU, LeakyReLU, ReLU6, SiLU, Hardswish, Hardsigmoid, ELU, SELU, CELU, Sigmoid,
#: Tanh); GELU has no in-place form. The fused SiLU's product is matched on its own
#: (`_in_place_activation`).
IN_PLACE_ACTIVATIONS: Final[frozenset[str]] = frozenset(
    {
        "Relu",
        "LeakyRelu",
        "Clip",
        "HardSwish",
        "HardSigmoid",
        "Elu",
        "Selu",
        "Celu",
        "Sigmoid",
        "Tanh",
    }
)

#: The autocast lists `Rules.WRITTEN` reads, as they stood when checkpoints learned against it
#: (`autocast.FP32_UNDER_AUTOCAST` and `autocast.LOW_PRECISION_MATMUL_OPS`, which
#: `Rules.RUNTIME` reads, have grown since): fp32 outputs, and operators that cast their weights.
_WRITTEN_FP32_OPS: Final[frozenset[str]] = frozenset(
    {
        "Softmax",
        "LogSoftmax",
        "LayerNormalization",
        "GroupNormalization",
        "InstanceNormalization",
        "Exp",
        "Log",
        "Pow",
        "ReduceSum",
        "ReduceMean",
        "ReduceL2",
    }
)
_WRITTEN_MATMUL_OPS: Final[frozenset[str]] = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})

_FP32_BYTES: Final[int] = 4
_LOW_PRECISION_BYTES: Final[int] = 2
_INDEX_BYTES: Final[int] = 8  # MaxPool's int64 argmax indices
_MASK_BYTES: Final[int] = 1  # the fused dropout kernel's boolean mask


class MemoryEstimateError(ValueError):
    """The graph handed to the estimator cannot describe a runnable model."""


class Rules(StrEnum):
    """How the estimator reads an fp32 export; each reading adds to the one before it.

    ``written`` counts the graph as exported: every activation at the job's precision,
    attention as written. ``runtime`` counts what CUDA runs: autocast's widths and casts
    (`autocast`) and the attention kernel the job runs (`attention`). ``eager`` also counts
    what eager PyTorch keeps that the graph does not show: each module call's arguments alive
    until its ``forward`` returns (`eager`, where the node names carry module paths), the
    argmax indices CUDA's MaxPool computes even for inference, the contiguous copies
    ``torch.matmul`` makes of operands whose batch dimensions broadcast, and autocast's weight-cast
    cache, which keeps each weight's low-precision copy from its first use to the end of an
    inference step run under ``torch.no_grad()`` (as timm's benchmark runs it;
    ``inference_mode`` keeps none, so this errs towards memory). It runs SiLU as the one kernel
    PyTorch has and promotes widths over data operands only (`autocast.widths`'
    ``typed_operands``). ``upcast`` also counts the fp32 copy autocast makes of a half-precision
    activation an fp32 operator reads (a LayerNorm after a convolution or a GELU,
    `autocast.upcasts_before`): alive while the operator runs and, when training, saved in
    place of the original. A checkpoint's memory heads learned their correction against one
    reading and are served with it (`checkpoint.Checkpoint.prior_rules`).
    """

    WRITTEN = "written"
    RUNTIME = "runtime"
    EAGER = "eager"
    UPCAST = "upcast"


#: The readings that count what eager PyTorch keeps (`Rules.EAGER` and the readings after it).
EAGER_READINGS: Final[frozenset[Rules]] = frozenset({Rules.EAGER, Rules.UPCAST})


#: The reading new checkpoints learn against and the API's own terms use.
DEFAULT_RULES: Final[Rules] = Rules.EAGER


#: Per reading, the operators read as views in one mode and not in the other.
_MODE_DEPENDENT_VIEWS: Final[Mapping[Rules, frozenset[str]]] = MappingProxyType(
    {
        rules: TRAINING_ONLY_VIEW_OPS
        | (EAGER_VIEW_OPS - RUNTIME_VIEW_OPS if rules in EAGER_READINGS else frozenset())
        for rules in Rules
    }
)


class Optimizer(StrEnum):
    """Training optimiser, which sets how many fp32 state tensors each parameter carries."""

    ADAM = "adam"
    ADAMW = "adamw"
    SGD_MOMENTUM = "sgd_momentum"
    SGD = "sgd"

    @property
    def states_per_parameter(self) -> int:
        """Adam keeps first and second moments; momentum SGD one buffer; plain SGD none."""
        if self in (Optimizer.ADAM, Optimizer.ADAMW):
            return 2
        if self is Optimizer.SGD_MOMENTUM:
            return 1
        return 0


@dataclass(frozen=True)
class DeviceProfile:
    """Model-independent memory a device's runtime holds, and its allocator's block size.

    Attributes:
        name: catalogue name of the device ("a100-80gb", "cpu", ...).
        context_bytes: the CUDA context with PyTorch's kernels loaded (NVML counts it as used).
        workspace_bytes: cuBLAS workspace plus a cuDNN convolution allowance.
        alignment_bytes: the allocator's rounding of each tensor (PyTorch's caching allocator
            rounds every block up to 512 bytes).
        foreach_optimizer: whether PyTorch's optimisers update all parameters with one
            multi-tensor ("foreach") kernel per operation, their default on GPUs; on CPUs they
            loop over the parameters, which changes how many temporaries a step holds.
        fused_dropout: whether training dropout runs PyTorch's fused kernel, which keeps a
            one-byte mask per element for backward (GPUs); without it (CPUs) dropout multiplies
            by a noise tensor of the activation's dtype and backward keeps that tensor.
    """

    name: str
    context_bytes: int
    workspace_bytes: int
    alignment_bytes: int = 512
    foreach_optimizer: bool = True
    fused_dropout: bool = True

    def __post_init__(self) -> None:
        if self.context_bytes < 0 or self.workspace_bytes < 0:
            raise MemoryEstimateError(f"device profile {self.name!r} has a negative constant")
        if self.alignment_bytes <= 0:
            raise MemoryEstimateError(f"device profile {self.name!r} needs a positive alignment")


# The constants are typical values with PyTorch 2 and CUDA 12/13 (lazy module loading), not
# measurements of any one driver: the context grows with the number of kernels a model touches.
# cuBLAS's default workspace is 32 MiB on Hopper (":4096:8") and about 8 MiB before it
# (":4096:2:16:8"); the cuDNN allowance is 64 MiB. Calibrate on measured data where it exists.
DEVICE_PROFILES: Final[Mapping[str, DeviceProfile]] = MappingProxyType(
    {
        "t4": DeviceProfile("t4", context_bytes=300 * units.MIB, workspace_bytes=72 * units.MIB),
        "l4": DeviceProfile("l4", context_bytes=350 * units.MIB, workspace_bytes=72 * units.MIB),
        "a100-40gb": DeviceProfile(
            "a100-40gb", context_bytes=420 * units.MIB, workspace_bytes=72 * units.MIB
        ),
        "a100-80gb": DeviceProfile(
            "a100-80gb", context_bytes=420 * units.MIB, workspace_bytes=72 * units.MIB
        ),
        "h100-80gb": DeviceProfile(
            "h100-80gb", context_bytes=500 * units.MIB, workspace_bytes=96 * units.MIB
        ),
        "h200": DeviceProfile(
            "h200", context_bytes=500 * units.MIB, workspace_bytes=96 * units.MIB
        ),
        # On a CPU the "context" is the runtime's resident baseline; it is best calibrated.
        "cpu": DeviceProfile(
            "cpu",
            context_bytes=0,
            workspace_bytes=0,
            alignment_bytes=64,
            foreach_optimizer=False,
            fused_dropout=False,
        ),
    }
)
DEFAULT_DEVICE: Final[DeviceProfile] = DEVICE_PROFILES["a100-80gb"]


@dataclass(frozen=True)
class OpNode:
    """One operator, as much of it as memory depends on.

    Attributes:
        op_type: ONNX operator type ("Conv", "Relu", ...).
        output_elements: elements of all its outputs together (at the graph's batch size).
        weight_elements: elements of the trainable initialisers it owns.
        scope: the module path it ran under (`perfgraph.PerfGraph.scope_of`), ``""`` when unknown.
        rank: dimensions of its first output (`perfgraph.PerfGraph.output_ranks`), 0 when
            unknown.
        broadcast_elements: elements ``torch.matmul`` copies its broadcast operands into
            (`perfgraph.PerfGraph.broadcast_copies`).
    """

    op_type: str
    output_elements: int
    weight_elements: int = 0
    scope: str = ""
    rank: int = 0
    broadcast_elements: int = 0

    def __post_init__(self) -> None:
        if self.output_elements < 0 or self.weight_elements < 0:
            raise MemoryEstimateError(f"{self.op_type}: element counts must be non-negative")


@dataclass(frozen=True)
class MemoryGraph:
    """The PerfGraph-level description the estimator needs: operators, data flow and the input.

    Attributes:
        nodes: the operators (any order; the estimator runs them in topological order, ties
            broken by index, which is ONNX's own execution order when nodes come in file order).
        edges: (producer, consumer) node index pairs; a tensor feeding several consumers appears
            once per consumer.
        input_elements: elements of the graph's inputs (the batch), held for the whole step.
        shared_weight_elements: weight elements counted by more than one operator (a tied
            embedding and output projection), so that the model's weights count once.
    """

    nodes: tuple[OpNode, ...]
    edges: tuple[tuple[int, int], ...]
    input_elements: int = 0
    shared_weight_elements: int = 0

    def __post_init__(self) -> None:
        if not self.nodes:
            raise MemoryEstimateError("a graph needs at least one operator")
        if self.input_elements < 0:
            raise MemoryEstimateError("input_elements must be non-negative")
        if not 0 <= self.shared_weight_elements <= sum(n.weight_elements for n in self.nodes):
            raise MemoryEstimateError(
                "shared_weight_elements must be between 0 and the operators' weight elements"
            )
        n = len(self.nodes)
        for src, dst in self.edges:
            if not (0 <= src < n and 0 <= dst < n):
                raise MemoryEstimateError(f"edge ({src}, {dst}) names a node outside 0..{n - 1}")
            if src == dst:
                raise MemoryEstimateError(f"edge ({src}, {dst}) is a self-loop")

    @property
    def parameters(self) -> int:
        """Trainable parameter count of the whole graph, tied weights once."""
        return sum(node.weight_elements for node in self.nodes) - self.shared_weight_elements

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data, so a graph extracted once can be cached and estimated again."""
        data: dict[str, Any] = {
            "nodes": [[n.op_type, n.output_elements, n.weight_elements] for n in self.nodes],
            "edges": [list(edge) for edge in self.edges],
            "input_elements": self.input_elements,
            "shared_weight_elements": self.shared_weight_elements,
        }
        if self.scoped:  # written only where known, so an unscoped graph's data is unchanged
            data["scopes"] = [n.scope for n in self.nodes]
        if any(n.rank for n in self.nodes):
            data["ranks"] = [n.rank for n in self.nodes]
        if any(n.broadcast_elements for n in self.nodes):
            data["broadcast"] = [n.broadcast_elements for n in self.nodes]
        return data

    @property
    def scoped(self) -> bool:
        """Whether any operator's module path is known (a TorchScript export's node names)."""
        return any(node.scope for node in self.nodes)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryGraph:
        """Inverse of `to_dict`. Data written without module paths reads as unscoped, without
        ranks as ranks unknown, without broadcast copies as none.

        Raises:
            MemoryEstimateError: the data does not describe a graph.
        """
        try:
            rows = data["nodes"]
            scopes = data.get("scopes") or [""] * len(rows)
            ranks = data.get("ranks") or [0] * len(rows)
            copies = data.get("broadcast") or [0] * len(rows)
            if not len(scopes) == len(ranks) == len(copies) == len(rows):
                raise ValueError(
                    f"{len(scopes)} scopes, {len(ranks)} ranks, {len(copies)} broadcast copies "
                    f"for {len(rows)} nodes"
                )
            nodes = tuple(
                OpNode(str(op), int(out), int(w), str(scope), int(rank), int(copy))
                for (op, out, w), scope, rank, copy in zip(rows, scopes, ranks, copies, strict=True)
            )
            edges = tuple((int(s), int(d)) for s, d in data["edges"])
            input_elements = int(data["input_elements"])
            shared = int(data["shared_weight_elements"])
        except (KeyError, TypeError, ValueError) as e:
            raise MemoryEstimateError(f"not a memory graph: {e!r}") from e
        return cls(nodes, edges, input_elements, shared)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak device memory of one step, term by term, in bytes.

    ``batch`` (the graph input, alive for the whole step) is kept apart from the activations the
    step creates because not every label counts it
    (`kubeseer.predictor.targets.memory_counts_batch`).
    """

    weights: int
    weight_copies: int
    gradients: int
    optimizer_state: int
    activations: int
    workspace: int
    cuda_context: int
    batch: int = 0

    @property
    def total(self) -> int:
        """Everything the job needs the device to hold at its peak."""
        return (
            self.weights
            + self.weight_copies
            + self.gradients
            + self.optimizer_state
            + self.activations
            + self.batch
            + self.workspace
            + self.cuda_context
        )

    def as_dict(self) -> dict[str, int]:
        """Every term and the total, for JSON reports."""
        return {
            "weights": self.weights,
            "weight_copies": self.weight_copies,
            "gradients": self.gradients,
            "optimizer_state": self.optimizer_state,
            "activations": self.activations,
            "workspace": self.workspace,
            "cuda_context": self.cuda_context,
            "batch": self.batch,
            "total": self.total,
        }


_NODE = {name: i for i, name in enumerate(schema.NODE_FEATURES)}
_TENSOR_BYTES = schema.EDGE_FEATURES.index("tensor_bytes")


def from_perfgraph(graph: perfgraph.PerfGraph) -> MemoryGraph:
    """The estimator's view of a PerfGraph (raw features, schema version 1 column names).

    A PerfGraph records, per operator, its memory access cost (distinct input, weight and output
    bytes), its weight bytes and its output element size, and per edge the bytes of the tensor
    it carries; output sizes are recovered from those:

    - a single-output operator with consumers: the tensor on its outgoing edges;
    - otherwise (several outputs, or a graph output): access cost minus weights minus the
      tensors on its incoming edges.

    The graph input is what the second rule leaves over at the operators reading it (largest
    such remainder), and weights are taken as fp32, the precision zoo models are exported in.
    Tied weights (`PerfGraph.params` counts a tensor once, node weight bytes once per reader)
    become `MemoryGraph.shared_weight_elements`.

    Raises:
        MemoryEstimateError: the graph was extracted with another feature schema.
    """
    if graph.schema_version != schema.SCHEMA_VERSION:
        raise MemoryEstimateError(
            f"graph has feature schema v{graph.schema_version}; the estimator reads "
            f"v{schema.SCHEMA_VERSION}"
        )
    features = graph.node_features
    n = graph.num_nodes
    src, dst = graph.edge_index
    tensor_bytes = graph.edge_features[:, _TENSOR_BYTES]
    incoming = np.bincount(dst, weights=tensor_bytes, minlength=n)
    outgoing_max = np.zeros(n)
    np.maximum.at(outgoing_max, src, tensor_bytes)
    has_consumers = np.bincount(src, minlength=n) > 0

    mac = features[:, _NODE["mac_bytes"]]
    weight_bytes = features[:, _NODE["weight_bytes"]]
    elem_bytes = np.maximum(features[:, _NODE["elem_bytes"]], 1.0)
    single_output = features[:, _NODE["num_outputs"]] <= 1
    leftover = np.maximum(mac - weight_bytes - incoming, 0.0)
    output_bytes = np.where(has_consumers & single_output, outgoing_max, leftover)
    graph_input_bytes = np.maximum(leftover - output_bytes, 0.0)

    weight_elements = [round(float(w) / _FP32_BYTES) for w in weight_bytes]
    nodes = tuple(
        OpNode(
            op_type=op,
            output_elements=round(float(output_bytes[i] / elem_bytes[i])),
            weight_elements=weight_elements[i],
            scope=graph.scope_of(i),
            rank=graph.output_ranks[i] if graph.output_ranks else 0,
            broadcast_elements=graph.broadcast_copies[i] if graph.broadcast_copies else 0,
        )
        for i, op in enumerate(graph.op_types)
    )
    return MemoryGraph(
        nodes=nodes,
        edges=tuple(zip(src.tolist(), dst.tolist(), strict=True)),
        input_elements=round(float(graph_input_bytes.max(initial=0.0)) / _FP32_BYTES),
        shared_weight_elements=min(
            max(sum(weight_elements) - graph.params, 0), sum(weight_elements)
        ),
    )


def _align(nbytes: int, alignment: int) -> int:
    return -(-nbytes // alignment) * alignment


def topological_order(graph: MemoryGraph) -> list[int]:
    """Kahn's algorithm, smallest ready index first, so an already ordered graph keeps its order.

    Raises:
        MemoryEstimateError: the graph has a cycle (it cannot be a single forward pass).
    """
    n = len(graph.nodes)
    indegree = [0] * n
    consumers: list[list[int]] = [[] for _ in range(n)]
    for src, dst in graph.edges:
        indegree[dst] += 1
        consumers[src].append(dst)
    ready = [i for i in range(n) if indegree[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        node = heapq.heappop(ready)
        order.append(node)
        for nxt in consumers[node]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                heapq.heappush(ready, nxt)
    if len(order) != n:
        raise MemoryEstimateError("the graph has a cycle; a forward pass must be acyclic")
    return order


@dataclass(frozen=True)
class _Storages:
    """Activation storages after resolving views (a view's bytes belong to the storage it
    views, its owner): their sizes, when they are alive, which are saved.

    Time is counted in slots: the operator at topological position ``i`` reads its inputs and
    writes its output in slot ``2 i``; one that carries a folded normalisation
    (`FOLDS_NORMALISATION`) writes its unnormalised output there and its normalised output in
    slot ``2 i + 1``. The loss is computed in the last slot, ``loss_slot``.
    """

    slot: dict[int, int]  # node -> slot it runs in
    nbytes: dict[int, int]  # owner -> aligned bytes
    start: dict[int, int]  # owner -> slot it is allocated
    end: dict[int, int]  # owner -> last slot it is read (loss_slot when it is a graph output)
    released: dict[int, int]  # saved owner -> slot of the first operator that saves it
    differentiable: set[int]  # owners that backward computes a gradient for
    unnormalised: dict[int, int]  # slot -> bytes of a folded normalisation's input
    loss_slot: int
    fused: frozenset[int]  # nodes inside a fused kernel (`_fused_interiors`): no storage
    # SDPA calls run on PyTorch's math path in fp32 (`_math_attention`)
    math_attention: tuple[attention.AttentionBlock, ...] = ()
    # (slot, slot, bytes) of operators the exporter merged that eager PyTorch computes again
    # for a reader in another module call (`eager.merged_reads`), inference read eagerly only
    recomputed: tuple[tuple[int, int, int], ...] = ()
    # slot -> last slot of a folded normalisation's input that a norm-act call holds until it
    # returns (`eager.normalised_and_activated`), inference read eagerly only
    normalised_until: Mapping[int, int] = field(default_factory=dict)
    # owner -> last slot its gradient is alive in backward where that is before `end`
    # (`Rules.UPCAST`: its last reader reads a cast copy, `_gradient_ends`)
    gradient_end: Mapping[int, int] = field(default_factory=dict)

    def normalising(self) -> list[tuple[int, int, int]]:
        """(first slot, last slot, bytes) of each folded normalisation's input while it is
        held: while the normalisation reads it (the slot it is written in and the next), or
        until the norm-act call it was given returns."""
        return [
            (first, self.normalised_until.get(first, first + 1), size)
            for first, size in self.unnormalised.items()
        ]


def _data_flow(graph: MemoryGraph) -> tuple[list[list[int]], list[list[int]]]:
    """Each node's producers and consumers (a tensor read twice listed twice)."""
    producers: list[list[int]] = [[] for _ in graph.nodes]
    consumers: list[list[int]] = [[] for _ in graph.nodes]
    for src, dst in graph.edges:
        producers[dst].append(src)
        consumers[src].append(dst)
    return producers, consumers


def attention_blocks(graph: MemoryGraph) -> list[attention.AttentionBlock]:
    """The attention spelled out in `graph` (`attention.find`)."""
    return attention.find(graph.nodes, *_data_flow(graph))


def unknown_ops(graph: MemoryGraph) -> frozenset[str]:
    """Operator types the saved-tensor rules do not know; they are assumed to save their inputs.

    Reported next to an estimate, so that a surprising number can be traced to an operator the
    rules guessed at.
    """
    known = SAVES_INPUTS | SAVES_OUTPUT | SAVES_NOTHING | SAVES_MASK_INPUTS
    return frozenset(op.op_type for op in graph.nodes if op.op_type not in known)


def _saves_inputs(op_type: str) -> bool:
    """Known input-saving operators, and (erring towards more memory) every unknown one."""
    return op_type in SAVES_INPUTS or op_type not in (
        SAVES_OUTPUT | SAVES_NOTHING | SAVES_MASK_INPUTS
    )


def _computes_tables(op: OpNode) -> bool:
    """Whether `op`, reading positions, computes a table rather than looking one up: arithmetic
    (with constants, which may be initializers), or layout that moves no weight (the
    initializers it reads, shapes and axes, are fewer elements than it writes)."""
    if op.op_type in TABLE_ARITHMETIC:
        return True
    return op.op_type in TABLE_LAYOUT and op.weight_elements < op.output_elements


def _has_parameters(op: OpNode) -> bool:
    """ONNX stores scalar constants (GELU's 0.5, attention's ``1/sqrt(d)``) as one-element
    initialisers, indistinguishable from a trained scalar (ReZero's alpha, rare); only larger
    initialisers are taken for trained parameters."""
    return op.weight_elements > 1


def _scales_by_constant(op: OpNode, producers: Sequence[int]) -> bool:
    """Whether `op` multiplies or divides one activation by a scalar: its backward needs only
    the scalar, so autograd saves no activation."""
    return op.op_type in ("Mul", "Div") and len(producers) == 1 and not _has_parameters(op)


def _activation_bytes(op_type: str, precision: Precision) -> int:
    if precision is Precision.FP32 or op_type in _WRITTEN_FP32_OPS:
        return _FP32_BYTES
    return _LOW_PRECISION_BYTES


def _is_linear_bias(
    graph: MemoryGraph, node: int, producers: list[list[int]], consumers: list[list[int]]
) -> bool:
    """Whether `node` is the bias Add of a Linear that ONNX split into MatMul + Add.

    PyTorch exports ``nn.Linear`` on inputs of rank 3 or more as MatMul followed by an Add of
    the bias, but runs it as one addmm into one output: the Add allocates nothing new.
    """
    if graph.nodes[node].op_type != "Add" or graph.nodes[node].weight_elements == 0:
        return False
    if len(producers[node]) != 1:
        return False
    matmul = producers[node][0]
    return graph.nodes[matmul].op_type == "MatMul" and consumers[matmul] == [node]


def _only(items: Sequence[int]) -> int | None:
    return items[0] if len(items) == 1 else None


def _gelu_head(
    graph: MemoryGraph, anchor: int, producers: list[list[int]], consumers: list[list[int]]
) -> tuple[int, set[int]] | None:
    """GELU's argument ``x`` and the nodes that compute from it what `anchor` reads: for Erf
    (exact GELU) ``x / sqrt(2)``, one Div or Mul; for Tanh (the tanh approximation)
    ``sqrt(2 / pi) * (x + 0.044715 * x ** 3)``, the cube (`_cube_of`), two Muls and an Add.
    None if the nodes before `anchor` are anything else."""
    scaled = _only(producers[anchor])
    if scaled is None or consumers[scaled] != [anchor]:
        return None
    if graph.nodes[scaled].op_type not in ("Div", "Mul"):
        return None
    if graph.nodes[anchor].op_type == "Erf":
        x = _only(producers[scaled])
        return None if x is None else (x, {scaled})
    inner = _only(producers[scaled])
    if inner is None or graph.nodes[inner].op_type != "Add" or consumers[inner] != [scaled]:
        return None
    if len(producers[inner]) != 2:
        return None
    first, second = producers[inner]
    for x, cubed in ((first, second), (second, first)):
        cube = _only(producers[cubed])
        if (
            graph.nodes[cubed].op_type == "Mul"
            and consumers[cubed] == [inner]
            and cube is not None
            and consumers[cube] == [cubed]
        ):
            powers = _cube_of(graph, cube, x, producers, consumers)
            if powers:
                return x, {scaled, inner, cubed, *powers}
    return None


def _cube_of(
    graph: MemoryGraph, cube: int, x: int, producers: list[list[int]], consumers: list[list[int]]
) -> set[int]:
    """The nodes that compute ``x ** 3`` ending at `cube`: a Pow, or (PyTorch's TorchScript
    exporter for ``approximate="tanh"``) ``x * (x * x)``. Empty if `cube` is neither."""
    if graph.nodes[cube].op_type == "Pow":
        return {cube} if producers[cube] == [x] else set()
    if graph.nodes[cube].op_type != "Mul" or len(producers[cube]) != 2 or x not in producers[cube]:
        return set()
    square = [p for p in producers[cube] if p != x]
    if (
        len(square) == 1
        and graph.nodes[square[0]].op_type == "Mul"
        and set(producers[square[0]]) == {x}
        and consumers[square[0]] == [cube]
    ):
        return {cube, square[0]}
    return set()


def _gelu_interior(
    graph: MemoryGraph, anchor: int, producers: list[list[int]], consumers: list[list[int]]
) -> set[int]:
    """The intermediates of GELU, exact or tanh-approximated, one PyTorch kernel.

    ONNX before opset 20 has no GELU, so the export spells it out around an Erf or a Tanh
    (`_gelu_head`), then an Add of 1 and two Muls; PyTorch computes it in one kernel that
    saves only ``x``. Exporters order the two Muls three ways: ``(x * (1 + erf)) * 0.5``,
    ``(x * 0.5) * (1 + erf)`` and, from the dynamo exporter, ``x * ((1 + erf) * 0.5)``.
    Returns the nodes whose outputs are never materialised (all but the last Mul), or nothing
    if the pattern differs.
    """
    head, plus_one = _gelu_head(graph, anchor, producers, consumers), _only(consumers[anchor])
    if head is None or plus_one is None or graph.nodes[plus_one].op_type != "Add":
        return set()
    x, interior = head
    product = _only(consumers[plus_one])
    if product is None or graph.nodes[product].op_type != "Mul":
        return set()
    interior |= {anchor, plus_one}
    others = [p for p in producers[product] if p != plus_one]
    if others == [x] or not others:
        # x * (1 + erf(.)) then the 0.5 scale, or (1 + erf(.)) * 0.5 then the product with x
        last = _only(consumers[product])
        if last is None or graph.nodes[last].op_type != "Mul":
            return set()
        if not others and sorted(producers[last]) != sorted([product, x]):
            return set()
        interior.add(product)
        return interior
    half_x = _only(others)
    if (
        half_x is None
        or graph.nodes[half_x].op_type != "Mul"
        or producers[half_x] != [x]
        or consumers[half_x] != [product]
    ):
        return set()
    interior.add(half_x)
    return interior


def _is_silu_sigmoid(
    graph: MemoryGraph, node: int, producers: list[list[int]], consumers: list[list[int]]
) -> bool:
    """Whether `node` is the Sigmoid of SiLU (``x * sigmoid(x)``), which ONNX before opset 22
    spells as a Sigmoid and a Mul and PyTorch runs as one kernel that saves only ``x``."""
    x, product = _only(producers[node]), _only(consumers[node])
    return (
        graph.nodes[node].op_type == "Sigmoid"
        and x is not None
        and product is not None
        and graph.nodes[product].op_type == "Mul"
        and sorted(producers[product]) == sorted([x, node])
    )


def _fused_interiors(
    graph: MemoryGraph,
    producers: list[list[int]],
    consumers: list[list[int]],
    blocks: Sequence[attention.AttentionBlock],
    attention_kernel: Attention,
    *,
    silu: bool,
) -> set[int]:
    """Nodes whose outputs exist only inside one fused PyTorch kernel: GELU, SiLU when `silu`
    (`Rules.EAGER`), and the attention `blocks` that `attention_kernel` fuses
    (`attention.fused_kernel`)."""
    interior = attention.fused_interior(blocks, attention_kernel)
    for node, op in enumerate(graph.nodes):
        if op.op_type in ("Erf", "Tanh"):
            interior |= _gelu_interior(graph, node, producers, consumers)
        elif silu and _is_silu_sigmoid(graph, node, producers, consumers):
            interior.add(node)
    return interior


def _in_place_activation(
    graph: MemoryGraph,
    activation: eager.ModuleCall,
    interior: set[int],
    producers: list[list[int]],
) -> int | None:
    """The operator of a norm-act module's `activation` call when it is one activation PyTorch
    applies in place (`IN_PLACE_ACTIVATIONS`, or SiLU's product of its fused Sigmoid): its
    output is the normalised tensor's storage. None for anything else (GELU, a sequence)."""
    outputs = [node for node in activation.members if node not in interior]
    if len(outputs) != 1:
        return None
    node = outputs[0]
    op_type = graph.nodes[node].op_type
    silu = op_type == "Mul" and any(
        p in interior and graph.nodes[p].op_type == "Sigmoid" for p in producers[node]
    )
    return node if silu or op_type in IN_PLACE_ACTIVATIONS else None


def _carries_folded_normalisation(
    graph: MemoryGraph, node: int, consumers: list[list[int]]
) -> bool:
    """Whether `node` is a convolution with a BatchNorm folded into it.

    An eval export folds a BatchNorm into the convolution before it, so the graph cannot show
    whether one was there, and every convolution is taken to carry one. A BatchNorm that reads
    a convolution's output through a Concat (DenseNet's layers, pre-activation blocks) cannot
    be folded and stays in the graph: that convolution's output is normalised there instead.
    """
    if graph.nodes[node].op_type not in FOLDS_NORMALISATION:
        return False
    readers = list(consumers[node])
    while readers:
        reader = readers.pop()
        if graph.nodes[reader].op_type == "BatchNormalization":
            return False
        if graph.nodes[reader].op_type == "Concat":
            readers.extend(consumers[reader])
    return True


def _index_assignments(
    graph: MemoryGraph, producers: Sequence[Sequence[int]], consumers: Sequence[Sequence[int]]
) -> tuple[dict[int, int], frozenset[int]]:
    """Eager PyTorch's reading of `INDEX_ASSIGNMENT_OPS`: each assignment's data producer, whose
    storage the assignment writes in place, and the index tensors nothing else reads, which the
    eager program never makes. Producers come in input order (data, indices, updates)."""
    in_place: dict[int, int] = {}
    index_reads: dict[int, int] = {}
    for node, op in enumerate(graph.nodes):
        if op.op_type in INDEX_ASSIGNMENT_OPS and len(producers[node]) == 3:
            data, indices, _ = producers[node]
            in_place[node] = data
            index_reads[indices] = index_reads.get(indices, 0) + 1
    index_only = frozenset(
        indices for indices, reads in index_reads.items() if reads == len(consumers[indices])
    )
    return in_place, index_only


def _storages(
    graph: MemoryGraph,
    order: Sequence[int],
    precision: Precision,
    align: int,
    *,
    training: bool,
    attention_kernel: Attention,
    rules: Rules,
) -> _Storages:
    runtime = rules is not Rules.WRITTEN
    eager_views = rules in EAGER_READINGS and not training
    all_views = EAGER_VIEW_OPS if eager_views else RUNTIME_VIEW_OPS if runtime else VIEW_OPS
    views = all_views - TRAINING_ONLY_VIEW_OPS if training else all_views
    slot = {node: 2 * i for i, node in enumerate(order)}
    loss_slot = 2 * len(order)
    producers, consumers = _data_flow(graph)
    kernel = attention_kernel if runtime else Attention.WRITTEN
    blocks = attention.find(graph.nodes, producers, consumers)
    interior = _fused_interiors(
        graph, producers, consumers, blocks, kernel, silu=rules in EAGER_READINGS
    )
    math_attention = (
        tuple(block for block in blocks if attention.upcasts(block, kernel))
        if rules in EAGER_READINGS and precision is not Precision.FP32
        else ()
    )
    # the math path's products of its fp32 copies, and matrix products autocast leaves alone
    in_fp32 = {
        node
        for block in math_attention
        for node in block.interior
        if graph.nodes[node].op_type != "Transpose"
    }
    uncast = {node for block in math_attention for node in (block.scores, block.output)}
    # A fused kernel reads its inputs when it runs, i.e. in the slot of its last node.
    read_slot: dict[int, int] = {}
    for node in reversed(order):
        read_slot[node] = (
            max((read_slot[c] for c in consumers[node]), default=loss_slot)
            if node in interior
            else slot[node]
        )

    # Training saves most module arguments for backward anyway, and the gradient walk mirrors
    # these lifetimes, which Python frames do not extend.
    frames = rules in EAGER_READINGS and not training
    calls = eager.module_calls([op.scope for op in graph.nodes], order) if frames else []
    merged = eager.merged_reads(calls, producers, consumers)
    folded = {
        n for n in order if n not in interior and _carries_folded_normalisation(graph, n, consumers)
    }
    norm_acts = eager.normalised_and_activated(calls, consumers, folded)
    in_place = {
        activation: convolution
        for convolution, norm_act in norm_acts.items()
        if (activation := _in_place_activation(graph, norm_act.activation, interior, producers))
        is not None
    }
    assigned, index_only = (
        _index_assignments(graph, producers, consumers)
        if rules in EAGER_READINGS
        else ({}, frozenset())
    )
    in_place.update(assigned)

    def kernel_of(node: int) -> int:
        """The operator whose kernel computes `node`: itself, or for a node inside a fused
        kernel the kernel's last node."""
        while node in interior and consumers[node]:
            node = max(consumers[node], key=slot.__getitem__)
        return node

    def graph_free(node: int) -> bool:
        """Read eagerly, an operator whose output needs no gradient saves nothing: autograd
        builds no backward node for it (the rotary tables a Llama computes from positions)."""
        return rules in EAGER_READINGS and not needs_grad[node]

    def saved_operands(node: int) -> list[int]:
        """The activation operands `node` saves for backward. Read eagerly, a product
        (`OPERAND_PRODUCTS`) keeps an operand only where a weight, or another operand that is
        not computed from positions (`positional`), needs the gradient it is read for:
        ``q * cos`` keeps the rotary table ``cos``, not the batch-sized ``q``."""
        operands = producers[node]
        product = rules in EAGER_READINGS and graph.nodes[node].op_type in OPERAND_PRODUCTS
        if not product or len(operands) < 2 or _has_parameters(graph.nodes[node]):
            return operands
        return [
            p
            for i, p in enumerate(operands)
            if any(needs_grad[q] and not positional[q] for j, q in enumerate(operands) if j != i)
        ]

    def materialised(node: int) -> list[int]:
        """`node`, or for a node inside a fused kernel the tensors the kernel computes it from
        (what saving it really keeps)."""
        if node not in interior:
            return [node]
        return [m for p in producers[node] for m in materialised(p)]

    def alias(node: int) -> int | None:
        """The producer whose storage `node`'s output is (a view, a Linear's bias Add, an
        activation applied in place): read as run, the largest (a Reshape's data, not its
        computed shape); as written, the first to run."""
        if node in in_place:
            return in_place[node]
        if (graph.nodes[node].op_type in views and producers[node]) or _is_linear_bias(
            graph, node, producers, consumers
        ):
            if runtime:
                return max(producers[node], key=lambda p: graph.nodes[p].output_elements)
            return min(producers[node], key=slot.__getitem__)
        return None

    width = (
        autocast.widths(
            graph.nodes, order, producers, precision, alias, typed_operands=rules in EAGER_READINGS
        )
        if runtime
        else [_activation_bytes(op.op_type, precision) for op in graph.nodes]
    )
    for node in in_fp32:
        width[node] = _FP32_BYTES
    owner = list(range(len(graph.nodes)))  # node -> node that owns its storage
    nbytes: dict[int, int] = {}
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    released: dict[int, int] = {}
    unnormalised: dict[int, int] = {}
    normalised_until: dict[int, int] = {}
    needs_grad = [False] * len(graph.nodes)
    # Computed from positions alone (a Range, then arithmetic with constants, and layout):
    # tables such as a rotary embedding's cosines. Its constants are initializers the graph
    # cannot tell from weights (a buffer's inverse frequencies), so it may read as needing a
    # gradient; autograd gives it none, and a product saves no batch-sized operand for it. A
    # table looked up or sliced from a weight by computed positions (MViTv2's relative
    # positions) is learned, not computed (`_computes_tables`).
    positional = [False] * len(graph.nodes)
    casts: dict[tuple[int, int], int] = {}  # (reader, fp32 storage) -> its autocast copy
    differentiable_casts: set[int] = set()
    recomputed: list[tuple[int, int, int]] = []
    for node in order:
        op = graph.nodes[node]
        needs_grad[node] = op.op_type not in NO_GRADIENT_OPS and (
            _has_parameters(op) or any(needs_grad[p] for p in producers[node])
        )
        positional[node] = op.op_type == "Range" or (
            _computes_tables(op)
            and any(positional[p] for p in producers[node])
            and all(
                positional[p] or graph.nodes[p].op_type in NO_GRADIENT_OPS for p in producers[node]
            )
        )
        aliased = alias(node)
        if aliased is not None:
            owner[node] = owner[aliased]
        else:
            size = _align(op.output_elements * width[node], align)
            # a view of constants only (a class token's expand) is a view of the weights
            constant_view = runtime and op.op_type in views
            made = node not in interior and node not in index_only and not constant_view
            nbytes[node] = size if made else 0
            start[node] = slot[node]
            if node in folded:
                unnormalised[slot[node]] = size
                start[node] += 1
                if node in norm_acts:
                    normalised_until[slot[node]] = read_slot[norm_acts[node].call.last]
        own = owner[node]
        again = merged.get(node, ())
        last = max((read_slot[c] for c in consumers[node] if c not in again), default=loss_slot)
        end[own] = max(end.get(own, slot[node]), last)
        if node not in interior:
            recomputed.extend((slot[c], slot[c], nbytes.get(own, 0)) for c in again)
        # autocast's copy of each activation read at another width than the operator runs in
        cast_to = (
            autocast.LOW_PRECISION_BYTES
            if runtime and autocast.casts_before(op, precision) and node not in uncast
            else autocast.FP32_BYTES
            if (rules is Rules.UPCAST and autocast.upcasts_before(op, precision))
            or (rules in EAGER_READINGS and autocast.copies_before(op, precision))
            else None
        )
        if cast_to is not None and node not in interior:
            for p in producers[node]:
                if p in interior or width[p] == cast_to:
                    continue
                copy = len(graph.nodes) + len(casts)
                casts[(node, owner[p])] = copy
                if needs_grad[p]:
                    differentiable_casts.add(copy)
                nbytes[copy] = _align(graph.nodes[p].output_elements * cast_to, align)
                start[copy], end[copy] = slot[node], read_slot[node]
        kept: list[int] = []
        if not graph_free(node):
            if op.op_type in SAVES_OUTPUT:
                kept.append(own)
            if op.op_type in SAVES_MASK_INPUTS:
                kept.extend(owner[p] for p in producers[node] if not needs_grad[p])
            elif _saves_inputs(op.op_type) and not _scales_by_constant(op, producers[node]):
                for p in saved_operands(node):
                    kept.extend(casts.get((node, owner[m]), owner[m]) for m in materialised(p))
        for saved in kept:
            released[saved] = min(released.get(saved, read_slot[node]), read_slot[node])
    if frames:
        held = eager.held_until(calls, producers, merged)
        # A Shape reads no data: `x.shape` binds no name to `x`. A fused kernel is one read:
        # ``F.silu(self.gate_proj(x))`` gives SiLU a temporary, though the export reads it
        # twice (its Sigmoid and its Mul) in the frame.
        data_readers = [
            [kernel_of(r) for r in readers if graph.nodes[r].op_type not in NO_GRADIENT_OPS]
            for readers in consumers
        ]
        bound = eager.bound_to_names(calls, producers, data_readers, order[-1], merged)
        for local, last in bound.items():
            if local not in held or slot[held[local]] < slot[last]:
                held[local] = last
        for argument, last in held.items():
            own = owner[argument]
            end[own] = max(end[own], read_slot[last])
    differentiable = differentiable_casts | {
        own for own in nbytes if own < len(graph.nodes) and needs_grad[own]
    }
    gradient_end = (
        _gradient_ends(consumers, owner, read_slot, end, casts) if rules is Rules.UPCAST else {}
    )
    return _Storages(
        slot,
        nbytes,
        start,
        end,
        released,
        differentiable,
        unnormalised,
        loss_slot,
        frozenset(interior),
        math_attention,
        tuple(recomputed),
        normalised_until,
        gradient_end,
    )


def _gradient_ends(
    consumers: Sequence[Sequence[int]],
    owner: Sequence[int],
    read_slot: Mapping[int, int],
    end: Mapping[int, int],
    casts: Mapping[tuple[int, int], int],
) -> dict[int, int]:
    """Owners whose gradient comes after their last reader's backward: that reader read a cast
    copy, so its backward makes the copy's gradient, and only the cast's backward, after the
    reader's output gradient is freed, makes the owner's. The gradient ends a slot earlier."""
    readers: dict[int, set[int]] = {}
    for node, node_consumers in enumerate(consumers):
        readers.setdefault(owner[node], set()).update(node_consumers)
    out = {}
    for own, last in end.items():
        at_last = [r for r in readers.get(own, ()) if read_slot[r] == last]
        if at_last and all((r, own) in casts for r in at_last):
            out[own] = last - 1
    return out


def _live_bytes(intervals: Iterable[tuple[int, int, int]], slots: int) -> np.ndarray:
    """Bytes alive in each of `slots` slots, given (first slot, last slot, bytes) intervals."""
    delta = np.zeros(slots + 1, dtype=np.int64)
    for first, last, size in intervals:
        delta[first] += size
        delta[last + 1] -= size
    return np.cumsum(delta[:slots])


def _backward_saved_bytes(
    graph: MemoryGraph,
    storages: _Storages,
    casts: Mapping[int, int],
    precision: Precision,
    device: DeviceProfile,
    rules: Rules,
) -> dict[int, int]:
    """Per slot, saved tensors that are not activations, freed by that operator's backward:
    MaxPool's argmax indices, Dropout's masks (`DeviceProfile.fused_dropout`; none inside a
    fused attention kernel, which draws its mask again in backward), `casts`, the
    low-precision weight copies matrix operators keep for their weight gradient under
    autocast, and (`Rules.EAGER`) the broadcast copies ``bmm`` saves for its backward and
    the fp32 value the math path of attention saves for ``P @ V``'s (`_math_attention`)."""
    align = device.alignment_bytes
    slot = storages.slot
    extra: dict[int, int] = (
        {first: size for first, _, size in _broadcast_copies(graph, storages, precision, align)}
        if rules in EAGER_READINGS
        else {}
    )
    for block in storages.math_attention:
        value = _align(graph.nodes[block.inputs[-1]].output_elements * _FP32_BYTES, align)
        extra[slot[block.output]] = extra.get(slot[block.output], 0) + value
    for node, op in enumerate(graph.nodes):
        size = casts.get(node, 0)
        if op.op_type == "MaxPool":
            size += _align(op.output_elements * _INDEX_BYTES, align)
        elif op.op_type == "Dropout" and node not in storages.fused:
            mask = _MASK_BYTES if device.fused_dropout else _activation_bytes("", precision)
            size += _align(op.output_elements * mask, align)
        if size:
            extra[slot[node]] = extra.get(slot[node], 0) + size
    return extra


def _broadcast_copies(
    graph: MemoryGraph, storages: _Storages, precision: Precision, align: int
) -> list[tuple[int, int, int]]:
    """(slot, slot, bytes) of the contiguous copies ``torch.matmul`` makes of operands whose
    batch dimensions broadcast, alive while the MatMul runs (autocast has cast its operands to
    the low precision first); none inside a fused attention kernel, which reads its operands
    as they are."""
    return [
        (
            storages.slot[node],
            storages.slot[node],
            _align(op.broadcast_elements * _activation_bytes(op.op_type, precision), align),
        )
        for node, op in enumerate(graph.nodes)
        if op.broadcast_elements and node not in storages.fused
    ]


def _math_attention(
    graph: MemoryGraph, storages: _Storages, align: int
) -> list[tuple[int, int, int]]:
    """(first slot, last slot, bytes) of what PyTorch's math path for scaled-dot-product
    attention makes beside the operators the export spells out, for each of
    `_Storages.math_attention`.

    Since PyTorch 2.5 (pytorch#128922) the path copies fp16 and bf16 query, key and value to
    fp32 and computes in fp32 (`_Storages` widens the scales, the scores and what lies between
    them to four bytes and leaves both products to it rather than to autocast). Its C++ frame
    holds the three copies until it returns after ``P @ V``; it returns the probabilities cast
    back to the call's precision, made right after the softmax, and ``P @ V``'s fp32 result,
    cast back while the result is alive."""
    nodes = graph.nodes
    out: list[tuple[int, int, int]] = []
    for block in storages.math_attention:
        first = min(storages.slot[node] for node in block.interior)
        last = storages.slot[block.output]
        # made once the softmax has returned and the scores it read are freed
        softmax = min(
            (storages.slot[n] + 1 for n in block.interior if nodes[n].op_type == "Softmax"),
            default=last,
        )
        out.extend(
            (first, last, _align(nodes[node].output_elements * _FP32_BYTES, align))
            for node in block.inputs
        )
        probabilities = nodes[block.scores].output_elements * _LOW_PRECISION_BYTES
        out.append((softmax, last, _align(probabilities, align)))
        out.append((last, last, _align(nodes[block.output].output_elements * _FP32_BYTES, align)))
    return out


def _pooling_indices(
    graph: MemoryGraph, storages: _Storages, align: int
) -> list[tuple[int, int, int]]:
    """(slot, slot, bytes) of the int64 argmax indices each MaxPool computes while it runs.

    CUDA's ``max_pool2d`` is ``max_pool2d_with_indices`` with the indices dropped, gradients or
    not; a training step saves them for backward (`_backward_saved_bytes`)."""
    return [
        (storages.slot[node], storages.slot[node], _align(op.output_elements * _INDEX_BYTES, align))
        for node, op in enumerate(graph.nodes)
        if op.op_type == "MaxPool"
    ]


def _optimizer_step_bytes(
    optimizer: Optimizer, weight_tensors: Sequence[int], device: DeviceProfile
) -> int:
    """Temporaries of one optimiser step. Adam's update divides by ``sqrt(v)``: the foreach
    implementation (PyTorch's default on GPUs) makes that square root for every parameter at
    once, the per-tensor one (CPUs) a square root and a quotient of one parameter at a time.
    SGD updates in place."""
    if optimizer not in (Optimizer.ADAM, Optimizer.ADAMW):
        return 0
    if device.foreach_optimizer:
        return sum(weight_tensors)
    return 2 * max(weight_tensors, default=0)


def _tied_gradient_sum(
    graph: MemoryGraph, storages: _Storages, align: int
) -> list[tuple[int, int, int]]:
    """(slot, slot, bytes) of the out-of-place sum of a tied weight's gradients.

    A weight read by two operators (a language model's vocabulary matrix, read by the
    embedding and by the output projection) gets a gradient from each, and autograd adds them
    out of place when backward reaches the first reader: during that operator's backward the
    two partial gradients and their sum are alive together, two copies more than the one
    gradient `estimate` counts; a traced BERT's training peak is there. The graph records only
    how many elements are shared in all (small constants can be shared too), so the sum is
    taken for the dominant tied weight, at the earliest operator holding more than half of
    them.
    """
    shared = graph.shared_weight_elements
    readers = [n for n in storages.slot if 2 * graph.nodes[n].weight_elements > shared > 0]
    if not readers:
        return []
    first = min(readers, key=storages.slot.__getitem__)
    tied = min(shared, graph.nodes[first].weight_elements)
    slot = storages.slot[first]
    return [(slot, slot, 2 * _align(tied * _FP32_BYTES, align))]


def _training_transient(
    graph: MemoryGraph,
    storages: _Storages,
    extra: Mapping[int, int],
    parameter_bytes: Mapping[int, int],
    gradients: int,
    optimizer_step: int,
    align: int,
) -> int:
    """Peak bytes of a training step beyond weights, optimiser state and batch.

    Three phases, each walked slot by slot:

    - forward keeps what backward will read: saved activations, the inputs of folded
      normalisations, `extra`;
    - backward, in reverse order, frees each saved tensor after the first operator that saved
      it, and allocates the gradients of activations (alive over the same slots as the
      activations themselves, mirrored) and of parameters (kept to the end);
    - the optimiser step holds every gradient and its own temporaries.

    The loss (cross-entropy on the graph's outputs, as classifiers and language models train)
    saves its log-probabilities and, at the start of backward, holds their gradient too.
    """
    loss_slot = storages.loss_slot
    slots = loss_slot + 1
    loss = sum(
        _align(graph.nodes[own].output_elements * _FP32_BYTES, align)
        for own in storages.differentiable
        if storages.end[own] == loss_slot
    )
    saved = storages.released
    kept_to_backward = [
        (first, loss_slot, size) for first, size in (*storages.unnormalised.items(), *extra.items())
    ]
    forward = _live_bytes(
        [
            (storages.start[own], loss_slot if own in saved else storages.end[own], size)
            for own, size in storages.nbytes.items()
        ]
        + kept_to_backward
        + [(loss_slot, loss_slot, loss)],
        slots,
    )
    # Tied weights accumulate into one gradient: never more than `gradients` in all.
    parameter_gradients = np.minimum(
        _live_bytes(
            ((0, storages.slot[node], size) for node, size in parameter_bytes.items()), slots
        ),
        gradients,
    )
    backward = parameter_gradients + _live_bytes(
        _tied_gradient_sum(graph, storages, align)
        + [(released, loss_slot, storages.nbytes[own]) for own, released in saved.items()]
        + kept_to_backward
        + [
            (
                storages.start[own],
                storages.gradient_end.get(own, storages.end[own]),
                storages.nbytes[own],
            )
            for own in storages.differentiable
        ]
        + storages.normalising()
        + [(loss_slot, loss_slot, 2 * loss)],
        slots,
    )
    return max(int(forward.max()), int(backward.max()), gradients + optimizer_step)


def estimate(
    graph: MemoryGraph | perfgraph.PerfGraph,
    *,
    mode: Mode,
    precision: Precision,
    optimizer: Optimizer = Optimizer.ADAM,
    device: DeviceProfile = DEFAULT_DEVICE,
    attention_kernel: Attention = Attention.AUTO,
    rules: Rules = DEFAULT_RULES,
) -> MemoryBreakdown:
    """Peak device memory of one training or inference step of `graph`, term by term.

    Args:
        graph: the model at a concrete batch size, as a `MemoryGraph` or a `PerfGraph`
            (converted with `from_perfgraph`).
        mode: training keeps gradients, optimiser state and saved activations; inference only
            the activations alive together.
        precision: fp16/bf16 halve most activations and add autocast's weight copies.
        optimizer: ignored for inference.
        device: runtime constants, allocator block size and optimiser implementation of the
            target device.
        attention_kernel: the kernel the job's attention runs (`attention.fused_kernel`): a fused
            one stores no sequence-by-sequence matrix.
        rules: how to read the export (`Rules`; ``written`` ignores `attention_kernel`); a
            checkpoint's prior is read as it learned.
    """
    by_mode = estimate_modes(
        graph,
        (mode,),
        precision=precision,
        optimizer=optimizer,
        device=device,
        attention_kernel=attention_kernel,
        rules=rules,
    )
    return by_mode[mode]


def estimate_modes(
    graph: MemoryGraph | perfgraph.PerfGraph,
    modes: Iterable[Mode] = tuple(Mode),
    *,
    precision: Precision,
    optimizer: Optimizer = Optimizer.ADAM,
    device: DeviceProfile = DEFAULT_DEVICE,
    attention_kernel: Attention = Attention.AUTO,
    rules: Rules = DEFAULT_RULES,
) -> dict[Mode, MemoryBreakdown]:
    """`estimate` for several modes at once, ordering the graph and resolving its storages
    once. The API asks for both modes on every request: done once, a small ResNet's request
    (extraction, analytic terms, network) went from 11.1 to 9.5 ms."""
    if isinstance(graph, perfgraph.PerfGraph):
        graph = from_perfgraph(graph)
    align = device.alignment_bytes
    order = topological_order(graph)
    inference = _storages(
        graph,
        order,
        precision,
        align,
        training=False,
        attention_kernel=attention_kernel,
        rules=rules,
    )
    # Storages differ between the modes only where a graph has operators that are views in one
    # mode only, or where inference keeps module arguments alive (`Rules.EAGER` on a graph
    # whose module paths are known).
    training = (
        _storages(
            graph,
            order,
            precision,
            align,
            training=True,
            attention_kernel=attention_kernel,
            rules=rules,
        )
        if (rules in EAGER_READINGS and graph.scoped)
        or any(op.op_type in _MODE_DEPENDENT_VIEWS[rules] for op in graph.nodes)
        else inference
    )
    # A job feeds its batch in fp32 under autocast, which casts it where a matmul reads it.
    input_width = _FP32_BYTES if rules is not Rules.WRITTEN else _activation_bytes("", precision)
    input_bytes = _align(graph.input_elements * input_width, align)
    parameter_bytes = {
        node: _align(op.weight_elements * _FP32_BYTES, align)
        for node, op in enumerate(graph.nodes)
        if op.weight_elements
    }
    weights = sum(parameter_bytes.values()) - graph.shared_weight_elements * _FP32_BYTES
    # autocast's low-precision copy of each matrix operator's weights
    matmul_ops = (
        autocast.LOW_PRECISION_MATMUL_OPS if rules is not Rules.WRITTEN else _WRITTEN_MATMUL_OPS
    )
    casts = (
        {}
        if precision is Precision.FP32
        else {
            node: _align(op.weight_elements * _LOW_PRECISION_BYTES, align)
            for node, op in enumerate(graph.nodes)
            if op.op_type in matmul_ops and op.weight_elements > 0
        }
    )
    out: dict[Mode, MemoryBreakdown] = {}
    for mode in modes:
        if mode is Mode.INFER:
            slots = inference.loss_slot + 1
            live = _live_bytes(
                [
                    (inference.start[own], inference.end[own], size)
                    for own, size in inference.nbytes.items()
                ]
                + inference.normalising()
                + (
                    _pooling_indices(graph, inference, align)
                    + _broadcast_copies(graph, inference, precision, align)
                    + _math_attention(graph, inference, align)
                    + list(inference.recomputed)
                    if rules in EAGER_READINGS
                    else []
                ),
                slots,
            )
            if rules in EAGER_READINGS:
                # autocast's weight-cast cache, kept under no_grad until the autocast region ends
                cached = _live_bytes(
                    [(inference.slot[node], slots - 1, size) for node, size in casts.items()],
                    slots,
                )
                at_peak = int((live + cached).argmax())
                weight_copies, activations = int(cached[at_peak]), int(live[at_peak])
            else:
                weight_copies, activations = max(casts.values(), default=0), int(live.max())
            out[mode] = MemoryBreakdown(
                weights=weights,
                weight_copies=weight_copies,
                gradients=0,
                optimizer_state=0,
                activations=activations,
                workspace=device.workspace_bytes,
                cuda_context=device.context_bytes,
                batch=input_bytes,
            )
            continue
        transient = _training_transient(
            graph,
            training,
            _backward_saved_bytes(graph, training, casts, precision, device, rules),
            parameter_bytes,
            gradients=weights,
            optimizer_step=_optimizer_step_bytes(optimizer, list(parameter_bytes.values()), device),
            align=align,
        )
        out[mode] = MemoryBreakdown(
            weights=weights,
            weight_copies=0,
            gradients=weights,
            optimizer_state=optimizer.states_per_parameter * weights,
            activations=transient - weights,
            workspace=device.workspace_bytes,
            cuda_context=device.context_bytes,
            batch=input_bytes,
        )
    return out


def calibrate(
    breakdowns: Sequence[MemoryBreakdown],
    observed_bytes: Sequence[float],
    base: DeviceProfile,
) -> DeviceProfile:
    """Refit the device's context constant so the estimator's median residual on data is zero.

    What the analytic model cannot see but every job pays (allocator pool headroom, the real
    context size of this driver, a CPU runtime's resident baseline) shows up as a roughly constant
    offset; the median is robust to the jobs whose activations the rules above misjudge.

    Raises:
        MemoryEstimateError: no data, or the two sequences differ in length.
    """
    if not breakdowns or len(breakdowns) != len(observed_bytes):
        raise MemoryEstimateError(
            f"calibration needs matching, non-empty data "
            f"({len(breakdowns)} estimates, {len(observed_bytes)} observations)"
        )
    residuals = [
        obs - (est.total - est.cuda_context)
        for est, obs in zip(breakdowns, observed_bytes, strict=True)
    ]
    return replace(base, context_bytes=max(0, round(statistics.median(residuals))))
