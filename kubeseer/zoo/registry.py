"""The table from family name to family record, and the named reference configurations."""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

from kubeseer.zoo import spec
from kubeseer.zoo.families import (
    base,
    bert,
    densenet,
    gpt,
    inception,
    llama,
    mlp,
    mobilenet,
    resnet,
    vgg,
    vit,
)

_BY_NAME: Final = MappingProxyType(
    {
        f.name: f
        for f in (
            vgg.FAMILY,
            resnet.RESNET,
            resnet.RESNEXT,
            mobilenet.V1,
            mobilenet.V2,
            densenet.FAMILY,
            inception.FAMILY,
            vit.FAMILY,
            bert.FAMILY,
            gpt.FAMILY,
            llama.FAMILY,
            mlp.FAMILY,
        )
    }
)


def family(name: str) -> base.Family:
    """The family record for `name`.

    Raises:
        InvalidSpecError: `name` is not one of `FAMILIES`.
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise spec.InvalidSpecError(
            f"unknown family {name!r}; expected one of {', '.join(spec.FAMILIES)}"
        ) from None


def _standard_index() -> dict[str, base.Family]:
    index: dict[str, base.Family] = {}
    for fam in _BY_NAME.values():
        for name in fam.standard:
            if name in index:
                raise RuntimeError(f"standard spec {name!r} is defined twice")
            index[name] = fam
    return index


_STANDARD: Final = MappingProxyType(_standard_index())
STANDARD_SPECS: Final[tuple[str, ...]] = tuple(_STANDARD)


def standard_spec(name: str) -> spec.ModelSpec:
    """The reference configuration called `name` (see `STANDARD_SPECS`).

    Raises:
        KeyError: no standard spec has that name; the message lists the known ones.
    """
    try:
        fam = _STANDARD[name]
    except KeyError:
        raise KeyError(f"no standard spec {name!r}; known: {', '.join(STANDARD_SPECS)}") from None
    arch, inputs = fam.standard[name]
    return spec.ModelSpec(fam.name, arch, inputs)
