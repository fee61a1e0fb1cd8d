"""From a spec to a runnable training step: the module, an example batch and the loss.

The measurement harness times exactly these three pieces, so they are defined once here and
the PerfGraph side (ONNX export of the same module) sees the same network.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from kubeseer.zoo import registry
from kubeseer.zoo.families import base
from kubeseer.zoo.spec import ModelSpec


def build_model(spec: ModelSpec) -> nn.Module:
    """The torch module `spec` describes, on the current default device, in training mode.

    Building under ``torch.device("meta")`` creates the module without allocating weights,
    which is how parameter counts and weight-free exports stay cheap for large models.
    """
    return registry.family(spec.family).build(spec)


def parameter_count(spec: ModelSpec) -> int:
    """Number of trainable parameters, counted on the meta device (no memory, no init)."""
    with torch.device("meta"):
        model = build_model(spec)
    return sum(p.numel() for p in model.parameters())


def _num_classes(spec: ModelSpec) -> int:
    return base.check_int(spec.arch["num_classes"], "arch.num_classes")


def example_batch(
    spec: ModelSpec,
    batch_size: int,
    device: torch.device | str = "cpu",
    *,
    seed: int = 0,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """A random batch the model accepts and a target its training loss accepts.

    Inputs are drawn from a seeded generator, so two calls return equal tensors; values do not
    matter for time or memory, but reproducibility keeps measurement runs comparable.

    Returns:
        ``(inputs, target)``: images ``(B, C, H, W)`` float and class ids ``(B,)``; token ids
        ``(B, S)`` int64 and next/masked token ids ``(B, S)``; features ``(B, F)`` and class
        ids ``(B,)``.

    Raises:
        ValueError: ``batch_size < 1``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    task = registry.family(spec.family).task
    generator = torch.Generator().manual_seed(seed)
    inputs: torch.Tensor
    target: torch.Tensor
    if task is base.Task.IMAGE_CLASSIFICATION:
        image = base.image_input(spec)
        shape = (batch_size, image.channels, image.image_size, image.image_size)
        inputs = torch.randn(shape, generator=generator)
        target = torch.randint(_num_classes(spec), (batch_size,), generator=generator)
    elif task.takes_tokens:
        tokens = base.token_input(spec)
        shape_2d = (batch_size, tokens.seq_len)
        inputs = torch.randint(tokens.vocab_size, shape_2d, generator=generator)
        target = torch.randint(tokens.vocab_size, shape_2d, generator=generator)
    else:
        features = base.check_int(spec.input["features"], "input.features")
        inputs = torch.randn((batch_size, features), generator=generator)
        target = torch.randint(_num_classes(spec), (batch_size,), generator=generator)
    return (inputs.to(device),), target.to(device)


def training_loss(spec: ModelSpec, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The scalar loss the family trains with: cross-entropy over classes or over the vocabulary.

    Raises:
        ValueError: `output` and `target` shapes do not fit the family's task.
    """
    task = registry.family(spec.family).task
    if task.takes_tokens:
        if output.dim() != 3 or output.shape[:2] != target.shape:
            raise ValueError(
                f"{spec.family}: expected logits (B, S, V) and targets (B, S), got "
                f"{tuple(output.shape)} and {tuple(target.shape)}"
            )
        return functional.cross_entropy(output.flatten(0, 1), target.flatten())
    if output.dim() != 2 or output.shape[0] != target.shape[0] or target.dim() != 1:
        raise ValueError(
            f"{spec.family}: expected logits (B, classes) and targets (B,), got "
            f"{tuple(output.shape)} and {tuple(target.shape)}"
        )
    return functional.cross_entropy(output, target)
