"""What every family module provides, and the typed reader that validates spec fields.

A family is a plain record of functions rather than a class hierarchy: the zoo needs nothing
from a family beyond "check this spec", "build this spec", "draw a spec" and "name your
reference configs", and a record keeps each family module a flat, readable file.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from kubeseer.zoo.spec import InvalidSpecError, ModelSpec
from kubeseer.zoo.spec import SizeClass as SizeClass  # re-exported for the family modules


class Task(enum.Enum):
    """What a family's model consumes and is trained on; decides example batches and loss."""

    IMAGE_CLASSIFICATION = "image_classification"
    MASKED_LM = "masked_lm"
    CAUSAL_LM = "causal_lm"
    FEATURE_CLASSIFICATION = "feature_classification"

    @property
    def takes_tokens(self) -> bool:
        return self in (Task.MASKED_LM, Task.CAUSAL_LM)


ArchInput = tuple[dict[str, Any], dict[str, Any]]


@dataclass(frozen=True)
class Family:
    """Everything the zoo asks of a model family.

    Attributes:
        name: the family name, one of `spec.FAMILIES`.
        task: decides the example batch and the training loss.
        check: raises `InvalidSpecError` unless the spec builds.
        build: the torch module for a valid spec.
        sample: draws one valid spec of the given size class from the random stream.
        standard: reference configurations by name, as (arch, input) dicts; kept as plain
            dicts because building `ModelSpec`s at import time would recurse into the registry.
    """

    name: str
    task: Task
    check: Callable[[ModelSpec], None]
    build: Callable[[ModelSpec], nn.Module]
    sample: Callable[[random.Random, SizeClass], ModelSpec]
    standard: Mapping[str, ArchInput]


class Fields:
    """Reads typed, range-checked values from one spec mapping and rejects unknown keys.

    Every family parses its spec through this reader, so that error messages name the field
    (``arch.layers[2]: must be >= 1, got 0``) and typos in keys are caught instead of being
    silently ignored.
    """

    def __init__(self, mapping: Mapping[str, Any], where: str) -> None:
        self._mapping = mapping
        self._where = where
        self._seen: set[str] = set()

    def _get(self, key: str) -> Any:
        self._seen.add(key)
        if key not in self._mapping:
            raise InvalidSpecError(f"{self._where}.{key}: missing")
        return self._mapping[key]

    def integer(self, key: str, *, lo: int = 1, hi: int | None = None) -> int:
        return check_int(self._get(key), f"{self._where}.{key}", lo=lo, hi=hi)

    def flag(self, key: str) -> bool:
        value = self._get(key)
        if not isinstance(value, bool):
            raise InvalidSpecError(f"{self._where}.{key}: must be true or false, got {value!r}")
        return value

    def choice(self, key: str, options: Sequence[Any]) -> Any:
        value = self._get(key)
        if isinstance(value, bool) or value not in options:
            raise InvalidSpecError(
                f"{self._where}.{key}: must be one of {list(options)}, got {value!r}"
            )
        return value

    def integers(
        self, key: str, *, lo: int = 1, hi: int | None = None, min_len: int = 1
    ) -> tuple[int, ...]:
        name = f"{self._where}.{key}"
        items = check_list(self._get(key), name, min_len=min_len)
        return tuple(check_int(v, f"{name}[{i}]", lo=lo, hi=hi) for i, v in enumerate(items))

    def rows(
        self, key: str, *, width: int, lo: int = 1, hi: int | None = None, min_len: int = 1
    ) -> tuple[tuple[int, ...], ...]:
        """A list of fixed-width integer rows, such as MobileNetV2's (t, c, n, s) table."""
        name = f"{self._where}.{key}"
        rows = check_list(self._get(key), name, min_len=min_len)
        parsed = []
        for i, row in enumerate(rows):
            cells = check_list(row, f"{name}[{i}]", min_len=width)
            if len(cells) != width:
                raise InvalidSpecError(f"{name}[{i}]: must have {width} entries, got {len(cells)}")
            parsed.append(
                tuple(check_int(v, f"{name}[{i}][{j}]", lo=lo, hi=hi) for j, v in enumerate(cells))
            )
        return tuple(parsed)

    def raw(self, key: str) -> Any:
        """The unparsed value, for nested structures a family walks itself."""
        return self._get(key)

    def done(self) -> None:
        """Reject keys nobody read: they would change the hash without changing the model."""
        extra = sorted(set(self._mapping) - self._seen)
        if extra:
            raise InvalidSpecError(f"{self._where}: unknown keys {extra}")


def check_int(value: Any, name: str, *, lo: int = 1, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSpecError(f"{name}: must be an integer, got {value!r}")
    if value < lo:
        raise InvalidSpecError(f"{name}: must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise InvalidSpecError(f"{name}: must be <= {hi}, got {value}")
    return value


def check_list(value: Any, name: str, *, min_len: int = 1) -> Sequence[Any]:
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise InvalidSpecError(f"{name}: must be a list, got {value!r}")
    if len(value) < min_len:
        raise InvalidSpecError(f"{name}: must have at least {min_len} entries")
    return value


def require(condition: bool, message: str) -> None:
    """Raise `InvalidSpecError` with `message` unless `condition` holds."""
    if not condition:
        raise InvalidSpecError(message)


@dataclass(frozen=True)
class ImageInput:
    image_size: int
    channels: int


def image_input(spec: ModelSpec, *, min_size: int = 8) -> ImageInput:
    fields = Fields(spec.input, "input")
    parsed = ImageInput(
        image_size=fields.integer("image_size", lo=min_size, hi=2048),
        channels=fields.integer("channels", lo=1, hi=16),
    )
    fields.done()
    return parsed


@dataclass(frozen=True)
class TokenInput:
    seq_len: int
    vocab_size: int


def token_input(spec: ModelSpec) -> TokenInput:
    fields = Fields(spec.input, "input")
    parsed = TokenInput(
        seq_len=fields.integer("seq_len", lo=1, hi=65536),
        vocab_size=fields.integer("vocab_size", lo=2, hi=1_000_000),
    )
    fields.done()
    return parsed


def require_within_positions(tokens: TokenInput, max_positions: int) -> None:
    """A token model's sequence must fit its position table (or its context window)."""
    require(
        tokens.seq_len <= max_positions,
        f"input.seq_len: {tokens.seq_len} exceeds arch.max_positions={max_positions}",
    )


def round_to(value: float, multiple: int) -> int:
    """Round a drawn width to a hardware-friendly multiple, never below the multiple itself."""
    return max(multiple, round(value / multiple) * multiple)


def width_ladder(rng: random.Random, start: int, stages: int, *, multiple: int = 8) -> list[int]:
    """Widths that double per stage, each jittered by +-25% so that sampled nets are not
    all scaled copies of one another."""
    return [round_to(start * 2**i * rng.uniform(0.75, 1.25), multiple) for i in range(stages)]


def cnn_head_classes(rng: random.Random, size: SizeClass) -> int:
    """Class counts of common datasets; larger models tend to have ImageNet-sized heads."""
    return rng.choice({"tiny": (10, 100), "small": (10, 100, 1000)}.get(size, (100, 1000)))
