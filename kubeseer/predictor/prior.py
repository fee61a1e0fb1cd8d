"""The analytic memory estimate as a prior that the learned memory heads correct.

A learned model is only as good as the architectures it has seen: on a family left out of
training, SeerNet-Multi's memory error grows several-fold, while the analytic estimator
(`baselines.analytic_memory`: weights, gradients, optimiser state, activations alive together)
follows from any graph. With a prior, a memory head learns ``log(label) - log(prior)``, the
part the physics misses (allocator rounding, saved tensors the rules get wrong, framework
temporaries), and its prediction is the prior times the learned correction. Other metrics get
a log prior of 0, i.e. none. Priors always come as one column per `targets.METRICS` entry, so
they describe the model's input whatever subset of metrics a dataset labels.

The prior is read by the estimator's `analytic_memory.DEFAULT_RULES` (autocast widths, the job's
attention kernel, what eager PyTorch keeps alive); a checkpoint records the rules it learned against
(`checkpoint.Checkpoint.prior_rules`) and is served with them. The prior is the estimator's
tensor bytes (its total less the CUDA context and workspace
constants), which is what an allocator-peak label measures; for device labels the correction
also absorbs the runtime's share. It is estimated for the kind of device the labels come from
(`label_device`): a CPU's allocator rounds less and its optimisers loop over parameters, which
makes the estimate of a CPU training peak 2.6 % off the labels where the GPU profile is 3.8 %.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from kubeseer.prediction import Attention, Mode, Precision
from kubeseer.predictor import analytic_memory, perfgraph, targets

#: The measurement harness's optimizers as the analytic estimator names them ("sgd" runs with
#: momentum 0.9, see kubeseer.measure.steps); inference-only samples ("none") use Adam, whose
#: training label they never carry.
STATE_OPTIMIZERS: Final[Mapping[str, analytic_memory.Optimizer]] = {
    "adam": analytic_memory.Optimizer.ADAM,
    "sgd": analytic_memory.Optimizer.SGD_MOMENTUM,
    targets.NO_OPTIMIZER: analytic_memory.Optimizer.ADAM,
}


def _state_optimizer(name: str) -> analytic_memory.Optimizer:
    """The estimator's optimizer for a sample's; one it does not know keeps no state."""
    return STATE_OPTIMIZERS.get(name, analytic_memory.Optimizer.SGD)


def label_device(device_kind: str) -> analytic_memory.DeviceProfile:
    """The estimator's profile for labels measured on `device_kind` ("cpu", "cuda"): tensor
    bytes depend on the allocator and the optimiser implementation, not on which GPU."""
    if device_kind == "cpu":
        return analytic_memory.DEVICE_PROFILES["cpu"]
    return analytic_memory.DEFAULT_DEVICE


def breakdown(
    graph: analytic_memory.MemoryGraph | perfgraph.PerfGraph,
    mode: Mode,
    precision: Precision,
    optimizer: str,
    device: analytic_memory.DeviceProfile = analytic_memory.DEFAULT_DEVICE,
    *,
    attention_kernel: Attention = Attention.AUTO,
    rules: analytic_memory.Rules = analytic_memory.DEFAULT_RULES,
) -> analytic_memory.MemoryBreakdown:
    """The analytic estimator's terms for one (graph, mode, precision, optimizer) on `device`,
    the job's attention running `attention_kernel`, read by `rules`."""
    return analytic_memory.estimate(
        graph,
        mode=mode,
        precision=precision,
        optimizer=_state_optimizer(optimizer),
        device=device,
        attention_kernel=attention_kernel,
        rules=rules,
    )


def tensor_bytes(terms: analytic_memory.MemoryBreakdown, *, with_batch: bool = True) -> int:
    """The estimate without the runtime constants: what an allocator peak measures, with or
    without the input batch (`targets.memory_counts_batch`)."""
    return terms.total - terms.cuda_context - terms.workspace - (0 if with_batch else terms.batch)


def breakdowns(
    graph: analytic_memory.MemoryGraph | perfgraph.PerfGraph,
    precision: Precision,
    optimizer: str,
    device: analytic_memory.DeviceProfile = analytic_memory.DEFAULT_DEVICE,
    *,
    attention_kernel: Attention = Attention.AUTO,
    rules: analytic_memory.Rules = analytic_memory.DEFAULT_RULES,
) -> dict[Mode, analytic_memory.MemoryBreakdown]:
    """The analytic terms of both modes on `device`, as the priors need them (`breakdown`)."""
    return analytic_memory.estimate_modes(
        graph,
        precision=precision,
        optimizer=_state_optimizer(optimizer),
        device=device,
        attention_kernel=attention_kernel,
        rules=rules,
    )


def log_priors(
    terms: Mapping[Mode, analytic_memory.MemoryBreakdown], *, with_batch: bool = True
) -> list[float]:
    """``log`` of the analytic tensor bytes (`tensor_bytes`) for each memory metric of
    `targets.METRICS`, 0 for every other one; `terms` as `breakdowns` gives them."""
    out = []
    for name in targets.METRICS:
        mode, quantity = targets.split_metric(name)
        if quantity == "memory_bytes":
            bytes_ = tensor_bytes(terms[Mode(mode)], with_batch=with_batch)
            out.append(math.log(max(bytes_, 1)))
        else:
            out.append(0.0)
    return out
