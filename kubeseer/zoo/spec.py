"""The serialisable identity of a zoo model: family, architecture and input hyper-parameters.

A `ModelSpec` is what crosses every boundary of the data pipeline: the sampler draws it, the
measurement harness records its JSON next to the labels, and the PerfGraph dataset regenerates
the ONNX graph from it. Its hash therefore has to be stable across processes, platforms and
Python versions, which is why it is computed from a canonical JSON form (sorted keys, no
whitespace, lists rather than tuples) and never from Python's `hash`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Literal, get_args

FAMILIES: Final[tuple[str, ...]] = (
    "vgg",
    "resnet",
    "resnext",
    "mobilenet_v1",
    "mobilenet_v2",
    "densenet",
    "inception",
    "vit",
    "bert",
    "gpt",
    "llama",
    "mlp",
)

SizeClass = Literal["tiny", "small", "medium", "large"]
"""How big sampled models are: tiny/small run a batch-1 forward in milliseconds on one CPU core,
medium/large are GPU-scale (docs/zoo.md lists each family's ranges)."""
SIZE_CLASSES: Final[tuple[SizeClass, ...]] = get_args(SizeClass)


class InvalidSpecError(ValueError):
    """A spec that cannot describe a buildable model (unknown family, bad or missing field)."""


def _freeze(value: Any, where: str) -> Any:
    """Deep-copy a JSON-like value into immutable containers, rejecting anything JSON cannot hold.

    Freezing makes a spec safe to use as a dict key or share between threads: nobody can
    mutate the mapping a hash was computed from.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidSpecError(f"{where}: {value!r} is not a finite number")
        return value
    if isinstance(value, list | tuple):
        return tuple(_freeze(item, f"{where}[{i}]") for i, item in enumerate(value))
    if isinstance(value, Mapping):
        frozen: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidSpecError(f"{where}: key {key!r} is not a string")
            frozen[key] = _freeze(item, f"{where}.{key}")
        return MappingProxyType(frozen)
    raise InvalidSpecError(f"{where}: {type(value).__name__} is not JSON-serialisable")


def _thaw(value: Any) -> Any:
    """Turn frozen containers back into the plain dicts and lists `json` writes."""
    if isinstance(value, tuple):
        return [_thaw(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _thaw(item) for key, item in value.items()}
    return value


@dataclass(frozen=True, eq=False)
class ModelSpec:
    """One model configuration of the zoo.

    Args:
        family: one of `FAMILIES`.
        arch: architecture hyper-parameters (depths, widths, kernel sizes, heads, classes ...);
            the keys each family accepts are documented in docs/zoo.md.
        input: what one example looks like: `image_size` and `channels` for vision families,
            `seq_len` and `vocab_size` for token families, `features` for MLPs.

    Construction validates the spec completely against its family's schema, so a `ModelSpec`
    that exists always builds.

    Raises:
        InvalidSpecError: unknown family, non-JSON values, or fields the family rejects.
    """

    family: str
    arch: Mapping[str, Any]
    input: Mapping[str, Any]

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise InvalidSpecError(
                f"unknown family {self.family!r}; expected one of {', '.join(FAMILIES)}"
            )
        if not isinstance(self.arch, Mapping) or not isinstance(self.input, Mapping):
            raise InvalidSpecError("arch and input must be mappings")
        object.__setattr__(self, "arch", _freeze(self.arch, "arch"))
        object.__setattr__(self, "input", _freeze(self.input, "input"))
        # Imported here because every family module imports this one for `ModelSpec`.
        from kubeseer.zoo import registry

        registry.family(self.family).check(self)

    def __eq__(self, other: object) -> bool:
        # Defined on the canonical JSON, like the hash: `1` and `1.0`, or `True` and `1`, are
        # equal in Python but distinct specs on disk.
        if not isinstance(other, ModelSpec):
            return NotImplemented
        return self.canonical_json() == other.canonical_json()

    def __hash__(self) -> int:
        return hash(self.canonical_json())

    def to_dict(self) -> dict[str, Any]:
        """Plain, mutable, JSON-ready form (lists, dicts)."""
        return {"family": self.family, "arch": _thaw(self.arch), "input": _thaw(self.input)}

    def canonical_json(self) -> str:
        """Sorted keys, no whitespace: the one byte string the hash is defined on."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    def to_json(self) -> str:
        """Serialise as canonical JSON, so equal specs serialise to equal bytes."""
        return self.canonical_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> ModelSpec:
        """Parse what `to_json` wrote (or any JSON object with the same three keys).

        Raises:
            InvalidSpecError: malformed JSON, missing or extra keys, or an invalid spec.
        """
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InvalidSpecError(f"not a JSON model spec: {e}") from e
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> ModelSpec:
        """Build from the form `to_dict` returns.

        Raises:
            InvalidSpecError: missing or extra keys, or an invalid spec.
        """
        if not isinstance(data, Mapping) or set(data) != {"family", "arch", "input"}:
            raise InvalidSpecError(
                "a model spec is a JSON object with exactly the keys family, arch and input"
            )
        family = data["family"]
        if not isinstance(family, str):
            raise InvalidSpecError(f"family must be a string, not {type(family).__name__}")
        return cls(family=family, arch=data["arch"], input=data["input"])

    def config_hash(self) -> str:
        """First 16 hex digits of the SHA-256 of the canonical JSON: a stable dataset key."""
        return hashlib.sha256(self.canonical_json().encode("ascii")).hexdigest()[:16]

    def describe(self) -> str:
        """One human-readable line, for progress bars, logs and `kubeseer zoo list`."""

        def render(mapping: Mapping[str, Any]) -> str:
            return " ".join(
                f"{key}={json.dumps(_thaw(value), separators=(',', ':'))}"
                for key, value in sorted(mapping.items())
            )

        return f"{self.family} [{self.config_hash()}] {render(self.arch)} | {render(self.input)}"
