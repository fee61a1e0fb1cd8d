"""One training or inference step of a zoo model, exactly as the dataset defines it.

The harness times these closures and nothing else, so what "a step" means for a label is
written down here once: inference is a forward pass under `torch.inference_mode()`;
training is zero-grad, forward and loss (under autocast for fp16/bf16), backward (through a
`GradScaler` for fp16, as mixed-precision training does in practice) and one optimiser step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from kubeseer import zoo
from kubeseer.measure import records

MODES = ("infer", "train")
PRECISIONS = ("fp32", "fp16", "bf16")
OPTIMIZERS = ("sgd", "adam")

_AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class TaskError(ValueError):
    """A task names a mode, precision, optimizer or batch size the harness does not know."""


@dataclass(frozen=True)
class Task:
    """One configuration to measure: a model spec at a batch size, mode, precision, optimizer.

    Inference tasks carry `records.NO_OPTIMIZER`; training tasks name "sgd" (momentum 0.9) or
    "adam" (default betas), both at learning rate 1e-3.
    """

    spec: zoo.ModelSpec
    batch_size: int
    mode: str
    precision: str
    optimizer: str

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise TaskError(f"batch size must be >= 1, got {self.batch_size}")
        if self.mode not in MODES:
            raise TaskError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.precision not in PRECISIONS:
            raise TaskError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        expected = OPTIMIZERS if self.mode == "train" else (records.NO_OPTIMIZER,)
        if self.optimizer not in expected:
            raise TaskError(
                f"a {self.mode} task takes optimizer in {expected}, got {self.optimizer!r}"
            )

    @property
    def key(self) -> tuple[str, int, str, str, str]:
        """Same key as `records.Record.key`, so resuming can match tasks to stored rows."""
        return (self.spec.config_hash(), self.batch_size, self.mode, self.precision, self.optimizer)

    def describe(self) -> str:
        """A short line for progress displays and the error log."""
        opt = f" {self.optimizer}" if self.mode == "train" else ""
        return (
            f"{self.spec.family}[{self.spec.config_hash()}] b={self.batch_size} "
            f"{self.mode} {self.precision}{opt}"
        )


@contextlib.contextmanager
def _autocast(device_type: str, precision: str) -> Iterator[None]:
    dtype = _AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device_type, dtype=dtype):
        yield


def make_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    """The optimiser a training task names (see `Task`)."""
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-3)
    raise TaskError(f"unknown optimizer {name!r}; expected one of {OPTIMIZERS}")


@dataclass
class Prepared:
    """A built model with its batch and step closure; kept together so tracking can see them."""

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    step: Callable[[], None]


def prepare(task: Task, device: torch.device) -> Prepared:
    """Build the model and batch on `device` and return the step closure for `task`."""
    with device:
        model = zoo.build_model(task.spec)
    inputs, target = zoo.example_batch(task.spec, task.batch_size, device)
    device_type = device.type
    if task.mode == "infer":
        model.eval()

        def infer() -> None:
            with torch.inference_mode(), _autocast(device_type, task.precision):
                model(*inputs)

        return Prepared(model, None, infer)

    model.train()
    optimizer = make_optimizer(task.optimizer, model)
    scaler = torch.amp.GradScaler(device_type) if task.precision == "fp16" else None

    def train() -> None:
        optimizer.zero_grad(set_to_none=True)
        with _autocast(device_type, task.precision):
            loss = zoo.training_loss(task.spec, model(*inputs), target)
        if scaler is None:
            loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
            optimizer.step()
        else:
            scaler.scale(loss).backward()  # type: ignore[no-untyped-call]  # as above
            scaler.step(optimizer)
            scaler.update()

    return Prepared(model, optimizer, train)


def count_flops_and_params(spec: zoo.ModelSpec) -> tuple[int, int]:
    """Forward FLOPs at batch size 1 and the parameter count, computed on the meta device.

    Counting on meta tensors costs no memory and no arithmetic, so it is cheap enough to run
    for every spec of a plan (the plan's FLOPs-decade stratification needs it before anything
    is measured). FLOPs follow `torch.utils.flop_counter` (2 per multiply-accumulate).
    """
    from torch.utils.flop_counter import FlopCounterMode

    meta = torch.device("meta")
    with meta:
        model = zoo.build_model(spec)
    model.eval()
    inputs, _ = zoo.example_batch(spec, 1, meta)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(*inputs)
    params = sum(p.numel() for p in model.parameters())
    return int(counter.get_total_flops()), int(params)
