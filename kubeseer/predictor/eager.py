"""What eager PyTorch keeps alive that a data-flow graph does not say: a module's inputs, and
the tensors a caller binds to names of its own.

A graph frees a tensor after its last reader. Eager PyTorch frees it when the last Python
reference goes, and a module call holds one on each of its arguments until ``forward``
returns: the caller's local (``x = self.blocks(x)`` rebinds ``x`` only after the call) or the
temporary on the caller's stack (``x + self.mlp(self.norm2(x))`` keeps ``norm2``'s output while
the MLP runs). So a transformer block's normalised input stays alive through its MLP, a
window partition's copy through the window attention, and the input of a stage through every
block of the stage. On timm's torch 2 inference the estimate without this was a median 18-19 %
under the derived live peak (docs/predictor.md). A tensor read twice in one frame was bound
to a name, which lives until the frame returns (`bound_to_names`): PNASNet's and NASNet's
estimates were 35 and 54 % under without it. A convolution whose output a norm-act module
normalises and activates (`normalised_and_activated`) stays alive through the activation.

Module calls are read off the module path of each operator, which PyTorch's TorchScript
exporter writes into node names (``/layer1/layer1.0/conv1/Conv`` ran in ``layer1``, then
``layer1.0``, then ``conv1``) and its dynamo exporter into node metadata
(`extract.scopes`). A call is a maximal run of operators, in execution order, under one module
path: a module called twice is two calls. Graphs that carry no path (hand-written ONNX, a file
whose metadata was stripped) have no calls and keep the graph's own lifetimes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ModuleCall:
    """One run of a module's ``forward``: its operators, and the last of them to run (a node,
    and its position in the execution order)."""

    scope: str
    members: frozenset[int]
    last: int
    last_position: int


def scope_of(node_name: str) -> str:
    """The module path `node_name` ran under (``"layer1/layer1.0/conv1"``), ``""`` for an
    operator of the top-level ``forward`` or a name that carries no path."""
    if not node_name.startswith("/"):
        return ""
    return node_name[1:].rpartition("/")[0]


def _prefixes(scope: str) -> list[str]:
    """`scope` and every module path enclosing it, outermost first."""
    if not scope:
        return []
    parts = scope.split("/")
    return ["/".join(parts[: depth + 1]) for depth in range(len(parts))]


def module_calls(scopes: Sequence[str], order: Sequence[int]) -> list[ModuleCall]:
    """Every module call in a graph whose node `n` ran under ``scopes[n]``, run in `order`."""
    calls: list[ModuleCall] = []
    open_runs: dict[str, list[int]] = {}
    position = {node: i for i, node in enumerate(order)}

    def close(scope: str) -> None:
        run = open_runs.pop(scope)
        calls.append(ModuleCall(scope, frozenset(run), run[-1], position[run[-1]]))

    for node in order:
        enclosing = _prefixes(scopes[node])
        for scope in [s for s in open_runs if s not in enclosing]:
            close(scope)
        for scope in enclosing:
            open_runs.setdefault(scope, []).append(node)
    for scope in list(open_runs):
        close(scope)
    return calls


def held_until(
    calls: Sequence[ModuleCall],
    producers: Sequence[Sequence[int]],
    merged: Mapping[int, Sequence[int]] | None = None,
) -> dict[int, int]:
    """Node -> the last operator of the latest-ending call it is an argument of. A node is an
    argument of a call when an operator inside the call reads it and it ran outside; where the
    exporter merged the operator read (`merged`, from `merged_reads`), the call was given that
    operator's input."""
    merged = merged or {}
    held: dict[int, ModuleCall] = {}
    for call in calls:
        for member in call.members:
            for read in producers[member]:
                producer = producers[read][0] if member in merged.get(read, ()) else read
                if producer in call.members:
                    continue
                current = held.get(producer)
                if current is None or current.last_position < call.last_position:
                    held[producer] = call
    return {node: call.last for node, call in held.items()}


def _call_chains(calls: Sequence[ModuleCall]) -> dict[int, list[ModuleCall]]:
    """Node -> the calls it ran in, outermost first."""
    chains: dict[int, list[ModuleCall]] = {}
    for call in sorted(calls, key=lambda c: c.scope.count("/")):
        for member in call.members:
            chains.setdefault(member, []).append(call)
    return chains


def _shared(chains: Mapping[int, Sequence[ModuleCall]], a: int, b: int) -> int:
    """How many calls nodes `a` and `b` ran in together."""
    first, second = chains.get(a, ()), chains.get(b, ())
    depth = 0
    while depth < min(len(first), len(second)) and first[depth] is second[depth]:
        depth += 1
    return depth


def merged_reads(
    calls: Sequence[ModuleCall],
    producers: Sequence[Sequence[int]],
    consumers: Sequence[Sequence[int]],
) -> dict[int, list[int]]:
    """Node -> its readers in other calls that eager PyTorch computed it again for.

    The TorchScript exporter merges identical operators on one tensor (common-subexpression
    elimination): the ReLU two NASNet cells each apply to a shared input is one node, placed in
    the first cell and read from the second. Eagerly, the second cell was given the ReLU's
    input and made its own ReLU, freed after its one reader; the first cell's ReLU was freed
    when that cell was done with it. Such a node reads a tensor from outside the calls it ran
    in and is read both inside them and from outside. A graph without module paths (no
    `calls`) has none."""
    if not calls:
        return {}
    chains = _call_chains(calls)
    merged: dict[int, list[int]] = {}
    for node, sources in enumerate(producers):
        if len(sources) != 1:
            continue
        entered = _shared(chains, sources[0], node)  # the depth its input came in from
        outside = [r for r in consumers[node] if _shared(chains, node, r) <= entered]
        if outside and len(outside) < len(consumers[node]):
            merged[node] = outside
    return merged


def bound_to_names(
    calls: Sequence[ModuleCall],
    producers: Sequence[Sequence[int]],
    consumers: Sequence[Sequence[int]],
    last_node: int,
    merged: Mapping[int, Sequence[int]],
) -> dict[int, int]:
    """Node -> the last operator of the call whose frame holds it in a local variable: a tensor
    read twice in one frame, by two calls it made or by its own operators.

    ``x = self.block(x)`` rebinds its name and frees the old tensor, so a tensor read once is
    not held past its reader. Python reads a tensor twice only through a name (or an
    attribute), and a name lives until the frame returns: ``x_cell_3 = self.cell_3(x_cell_1,
    x_cell_2)`` in PNASNet and NASNet, whose cells read the outputs of the two before them (all
    alive to the end of ``forward_features``), SelecSLS's ``d1``, read by the next convolution
    and by the concatenation, a U-Net's skip. A name rebound after its last reader
    (``x = x + self.mlp(x)``) is held no longer than before, its caller's frame being the
    block. Callers pass `consumers` without the readers of shapes, which read no data, and
    with a fused kernel's interior read as the kernel (``F.silu(self.gate_proj(x))`` reads
    its temporary once). A plain function's frame does not show in module paths, so what it
    binds is read as bound in the module that called it: right for Swin's ``_attn`` method,
    which returns at the end of the block (requiring a call among the readers put Swin-L 12 %
    further under), and over for a Llama's ``rotate(x, cos, sin)``, whose queries are held to
    the end of the attention (a 2-layer Llama at 512 tokens 25 % over, docs/predictor.md).
    `last_node` is the graph's last operator, where the top-level ``forward`` returns. A call
    reading an operator the exporter merged (`merged`, from `merged_reads`) was given that
    operator's input, and reads it. A graph without module paths (no `calls`) has no frames
    to read."""
    if not calls:
        return {}  # names without module paths: no frames to read
    chains = _call_chains(calls)
    readers = [list(r) for r in consumers]
    for node, outside in merged.items():
        readers[node] = [r for r in readers[node] if r not in outside]
        readers[producers[node][0]].extend(outside)
    held: dict[int, int] = {}
    for node, reading_nodes in enumerate(readers):
        outer = chains.get(node, [])
        # caller's depth -> what read in its frame: the calls it made (by their last
        # operator) and its own operators
        reading: dict[int, set[int]] = {}
        for reader in reading_nodes:
            inner = chains.get(reader, [])
            depth = _shared(chains, node, reader)
            in_frame = inner[depth].last if depth < len(inner) else reader
            reading.setdefault(depth, set()).add(in_frame)
        callers = [depth for depth, made in reading.items() if len(made) >= 2]
        if callers:
            depth = min(callers)
            held[node] = outer[depth - 1].last if depth else last_node
    return held


@dataclass(frozen=True)
class NormAct:
    """A call that ran a BatchNorm the export folded away and then one child call, the
    activation: timm's ``BatchNormAct2d`` (``x = self.bn(x)`` inside a ``ConvNormAct``)."""

    call: ModuleCall
    activation: ModuleCall


def normalised_and_activated(
    calls: Sequence[ModuleCall],
    consumers: Sequence[Sequence[int]],
    convolutions: Iterable[int],
) -> dict[int, NormAct]:
    """Convolution -> the norm-act call its output was given.

    The export folds a BatchNorm into the convolution before it, so its output goes straight to
    the activation. Eagerly, the caller passed the unnormalised output to the norm-act module
    and holds it until that module returns: while the activation runs, three tensors the size
    of the output can be alive (coatnet's GELU; 29 % under the derived live peak without this).
    Such a module shows in the graph as a call whose every operator ran in one child call,
    entered from the convolution's frame, and every reader of the convolution is in that child.
    A module of its own that is the activation (ResNet's ``act1``) is entered alone: the folded
    BatchNorm ran in a module before it (``bn1``), which returned first.
    """
    if not calls:
        return {}
    chains = _call_chains(calls)
    found: dict[int, NormAct] = {}
    for convolution in convolutions:
        entered: set[tuple[ModuleCall, ModuleCall]] = set()
        for reader in consumers[convolution]:
            inner = chains.get(reader, [])
            depth = _shared(chains, convolution, reader)
            if len(inner) < depth + 2:
                break
            entered.add((inner[depth], inner[depth + 1]))
        else:
            if len(entered) == 1:
                call, activation = entered.pop()
                if call.members == activation.members:
                    found[convolution] = NormAct(call, activation)
    return found
