"""Measurement plans: small YAML files expanded into a deterministic, stratified task list.

A plan names families, size classes, batch sizes, precisions, modes and optimizers, and how
many specs and configurations to draw. Expansion is stratified twice, so that a plan of any
size covers the space evenly rather than by luck:

- specs: for each (family, size class), `oversample x specs_per_size` candidates are drawn and
  their batch-1 forward FLOPs counted on the meta device; specs are then taken round-robin over
  the FLOPs decades the candidates fall in, so every decade present is represented;
- configurations: each spec gets `configs_per_spec` (batch, mode, precision, optimizer)
  combinations, alternating modes and cycling batch sizes and precisions from a per-spec offset,
  so every batch size and precision appears across specs of every family. A plan may cap the
  FLOPs of one step (`max_step_flops`), which drops the largest batch sizes of the largest
  specs: that is how a CPU plan stays within hours.

The same plan file and seed always expand to the same tasks in the same order, which is what
lets an interrupted collection resume by skipping keys already stored.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kubeseer import zoo
from kubeseer.measure import records, steps


class PlanError(ValueError):
    """A plan file that is missing, malformed or names unknown values."""


@dataclass(frozen=True)
class Plan:
    """A parsed plan file; see plans/*.yaml and docs/dataset.md for the fields."""

    name: str
    seed: int
    families: tuple[str, ...]
    sizes: tuple[zoo.SizeClass, ...]
    specs_per_size: int
    oversample: int
    configs_per_spec: int
    batch_sizes: tuple[int, ...]
    modes: tuple[str, ...]
    precisions: tuple[str, ...]
    optimizers: tuple[str, ...]
    warmup: int
    iterations: int
    cooldown_s: float
    max_step_flops: float | None = None


@dataclass(frozen=True)
class PlannedTask:
    """A task with the spec's batch-1 forward FLOPs and parameter count."""

    task: steps.Task
    flops: int
    params: int


@dataclass(frozen=True)
class Expansion:
    """The tasks a plan expands to, and the candidate specs that could not be built."""

    tasks: tuple[PlannedTask, ...]
    rejected: tuple[tuple[str, str], ...]


def _tuple(data: Mapping[str, Any], key: str, kind: type, allowed: tuple[Any, ...] | None) -> Any:
    value = data.get(key)
    if value == "all" and allowed is not None:
        return allowed
    if not isinstance(value, list) or not value:
        raise PlanError(f"{key}: expected a non-empty list, got {value!r}")
    for item in value:
        if not isinstance(item, kind) or isinstance(item, bool):
            raise PlanError(f"{key}: {item!r} is not a {kind.__name__}")
        if allowed is not None and item not in allowed:
            raise PlanError(f"{key}: {item!r} is not one of {', '.join(map(str, allowed))}")
    return tuple(value)


def _int(data: Mapping[str, Any], key: str, minimum: int, default: int | None = None) -> int:
    value = data.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise PlanError(f"{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def parse_plan(data: Any) -> Plan:
    """Validate a plan's YAML mapping.

    Raises:
        PlanError: a field is missing, of the wrong type or out of range.
    """
    if not isinstance(data, Mapping):
        raise PlanError("a plan is a YAML mapping")
    known = set(Plan.__dataclass_fields__)
    unknown = set(data) - known
    if unknown:
        raise PlanError(f"unknown plan fields: {', '.join(sorted(unknown))}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise PlanError(f"name: expected a non-empty string, got {name!r}")
    cap = data.get("max_step_flops")
    if cap is not None and (not isinstance(cap, int | float) or isinstance(cap, bool) or cap <= 0):
        raise PlanError(f"max_step_flops: expected a positive number or null, got {cap!r}")
    cooldown = data.get("cooldown_s", 0.5)
    if not isinstance(cooldown, int | float) or isinstance(cooldown, bool) or cooldown < 0:
        raise PlanError(f"cooldown_s: expected a number >= 0, got {cooldown!r}")
    batch_sizes = _tuple(data, "batch_sizes", int, None)
    if min(batch_sizes) < 1:
        raise PlanError(f"batch_sizes: every batch size must be >= 1, got {batch_sizes}")
    modes = _tuple(data, "modes", str, steps.MODES)
    optimizers: tuple[str, ...] = ()
    if "train" in modes:
        optimizers = _tuple(data, "optimizers", str, steps.OPTIMIZERS)
    return Plan(
        name=name,
        seed=_int(data, "seed", 0, 0),
        families=_tuple(data, "families", str, zoo.FAMILIES),
        sizes=_tuple(data, "sizes", str, zoo.SIZE_CLASSES),
        specs_per_size=_int(data, "specs_per_size", 1),
        oversample=_int(data, "oversample", 1, 2),
        configs_per_spec=_int(data, "configs_per_spec", 1),
        batch_sizes=batch_sizes,
        modes=modes,
        precisions=_tuple(data, "precisions", str, steps.PRECISIONS),
        optimizers=optimizers,
        warmup=_int(data, "warmup", 5, 5),
        iterations=_int(data, "iterations", 30, 30),
        cooldown_s=float(cooldown),
        max_step_flops=None if cap is None else float(cap),
    )


def load_plan(path: Path) -> Plan:
    """Read and validate a plan file.

    Raises:
        PlanError: the file is missing, not YAML, or not a valid plan.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise PlanError(f"cannot read plan {path}: {e}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PlanError(f"{path}: not YAML: {e}") from e
    return parse_plan(data)


def flops_decade(flops: int) -> int:
    """floor(log10(FLOPs)), with models under 1 FLOP in decade 0."""
    return math.floor(math.log10(flops)) if flops >= 1 else 0


def step_flops(flops: int, batch_size: int, mode: str) -> float:
    """Rough FLOPs of one step: forward at `batch_size`, tripled for training (backward ~2x)."""
    return float(flops) * batch_size * (3 if mode == "train" else 1)


def _combos(plan: Plan, flops: int) -> dict[str, list[tuple[int, str, str]]]:
    """Per mode, every (batch, precision, optimizer) the plan allows within its FLOPs cap."""
    by_mode: dict[str, list[tuple[int, str, str]]] = {}
    for mode in plan.modes:
        optimizers = plan.optimizers if mode == "train" else (records.NO_OPTIMIZER,)
        combos = [
            (batch, precision, optimizer)
            for batch in plan.batch_sizes
            if plan.max_step_flops is None or step_flops(flops, batch, mode) <= plan.max_step_flops
            for precision in plan.precisions
            for optimizer in optimizers
        ]
        if combos:
            by_mode[mode] = combos
    return by_mode


def _configs_for(
    plan: Plan, flops: int, index: int, rng: random.Random
) -> list[tuple[str, int, str, str]]:
    """`configs_per_spec` distinct configurations for the `index`-th spec of a stratum.

    Modes alternate (starting with a different one for odd specs); within a mode the
    combinations are visited with a random stride from a random offset, which covers the
    whole list evenly across specs while keeping each spec's choice spread out.
    """
    by_mode = _combos(plan, flops)
    modes = [mode for mode in plan.modes if mode in by_mode]
    if not modes:
        return []
    if index % 2 and len(modes) > 1:
        modes.reverse()
    cursors = {mode: rng.randrange(len(combos)) for mode, combos in by_mode.items()}
    strides = {mode: _coprime_stride(len(combos), rng) for mode, combos in by_mode.items()}
    chosen: list[tuple[str, int, str, str]] = []
    limit = min(plan.configs_per_spec, sum(len(c) for c in by_mode.values()))
    used: set[tuple[str, int, str, str]] = set()
    turn = 0
    while len(chosen) < limit:
        mode = modes[turn % len(modes)]
        turn += 1
        combos = by_mode[mode]
        if all((mode, *c) in used for c in combos):
            continue
        while True:
            batch, precision, optimizer = combos[cursors[mode] % len(combos)]
            cursors[mode] += strides[mode]
            if (mode, batch, precision, optimizer) not in used:
                break
        used.add((mode, batch, precision, optimizer))
        chosen.append((mode, batch, precision, optimizer))
    return chosen


def _coprime_stride(length: int, rng: random.Random) -> int:
    """A step that visits every index of a list of `length` before repeating."""
    candidates = [s for s in range(1, max(2, length)) if math.gcd(s, length) == 1] or [1]
    return rng.choice(candidates)


Counter = Callable[[zoo.ModelSpec], tuple[int, int]]


def _stratified_specs(
    candidates: list[tuple[zoo.ModelSpec, int, int]], wanted: int, rng: random.Random
) -> list[tuple[zoo.ModelSpec, int, int]]:
    """Round-robin over FLOPs decades (smallest first) until `wanted` specs are taken."""
    by_decade: dict[int, list[tuple[zoo.ModelSpec, int, int]]] = defaultdict(list)
    for item in candidates:
        by_decade[flops_decade(item[1])].append(item)
    for bucket in by_decade.values():
        rng.shuffle(bucket)
    chosen: list[tuple[zoo.ModelSpec, int, int]] = []
    decades = sorted(by_decade)
    while len(chosen) < wanted and any(by_decade[d] for d in decades):
        for decade in decades:
            if by_decade[decade] and len(chosen) < wanted:
                chosen.append(by_decade[decade].pop())
    return chosen


def expand(plan: Plan, counter: Counter = steps.count_flops_and_params) -> Expansion:
    """Every task of `plan`, in measurement order, with FLOPs and parameter counts.

    Tasks are interleaved across families (spec by spec), so a collection cut short by its
    time budget still covers every family. Candidate specs whose model cannot be built are
    left out and reported in `Expansion.rejected` as (spec JSON, reason), as are
    (family/size) strata the zoo cannot sample.
    """
    rejected: list[tuple[str, str]] = []
    per_family: dict[str, list[PlannedTask]] = {}
    for family in plan.families:
        family_tasks: list[PlannedTask] = []
        for size in plan.sizes:
            rng = random.Random(f"kubeseer.measure:{plan.seed}:{family}:{size}")
            try:
                drawn = zoo.sample_specs(
                    family, plan.specs_per_size * plan.oversample, plan.seed, size=size
                )
            except (zoo.InvalidSpecError, zoo.SamplerExhaustedError) as e:
                rejected.append((f"{family}/{size}", f"{type(e).__name__}: {e}"))
                continue
            candidates: list[tuple[zoo.ModelSpec, int, int]] = []
            for spec in drawn:
                try:
                    flops, params = counter(spec)
                except Exception as e:
                    rejected.append((spec.to_json(), f"{type(e).__name__}: {e}"))
                    continue
                candidates.append((spec, flops, params))
            chosen = _stratified_specs(candidates, plan.specs_per_size, rng)
            for index, (spec, flops, params) in enumerate(chosen):
                for mode, batch, precision, optimizer in _configs_for(plan, flops, index, rng):
                    task = steps.Task(spec, batch, mode, precision, optimizer)
                    family_tasks.append(PlannedTask(task, flops, params))
        per_family[family] = family_tasks
    ordered: list[PlannedTask] = []
    depth = max((len(t) for t in per_family.values()), default=0)
    for i in range(depth):
        for family_tasks in per_family.values():
            if i < len(family_tasks):
                ordered.append(family_tasks[i])
    return Expansion(tuple(ordered), tuple(rejected))


class CachedCounter:
    """`steps.count_flops_and_params` with a JSON cache keyed by config hash.

    Counting takes a fraction of a second per spec, which adds up to many minutes for a large
    plan; a resumed collection should not pay it again.
    """

    def __init__(self, path: Path, counter: Counter = steps.count_flops_and_params) -> None:
        self.path = path
        self._counter = counter
        self._cache: dict[str, list[int]] = {}
        if path.exists():
            try:
                self._cache = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                self._cache = {}

    def __call__(self, spec: zoo.ModelSpec) -> tuple[int, int]:
        """FLOPs and parameters of `spec`, counted once."""
        key = spec.config_hash()
        if key not in self._cache:
            self._cache[key] = list(self._counter(spec))
        flops, params = self._cache[key]
        return flops, params

    def prefill(self, specs: Sequence[zoo.ModelSpec], workers: int) -> None:
        """Count every uncached spec of `specs` up front, in `workers` forked processes.

        Counting is single-threaded Python dispatch, so a large plan on a many-core GPU host
        expands several times faster this way. Specs cross the process boundary as JSON.
        """
        missing = {
            s.config_hash(): s.to_json() for s in specs if s.config_hash() not in self._cache
        }
        if not missing:
            return
        if workers <= 1:
            for spec in specs:
                self(spec)
            return
        context = multiprocessing.get_context("fork")
        with context.Pool(workers) as pool:
            counted = pool.map(_count_json, list(missing.values()), chunksize=4)
        for key, result in zip(missing, counted, strict=True):
            if result is not None:
                self._cache[key] = list(result)

    def save(self) -> None:
        """Write the cache (atomically, so a crash never leaves half a file)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self._cache, sort_keys=True), encoding="utf-8")
        temporary.replace(self.path)


def _count_json(spec_json: str) -> tuple[int, int] | None:
    """Pool worker: count one spec given as JSON; None if its model cannot be built."""
    try:
        return steps.count_flops_and_params(zoo.ModelSpec.from_json(spec_json))
    except Exception:
        return None


def candidates(plan: Plan) -> list[zoo.ModelSpec]:
    """Every candidate spec `expand` will count, for prefilling a `CachedCounter`."""
    drawn: list[zoo.ModelSpec] = []
    for family in plan.families:
        for size in plan.sizes:
            try:
                drawn += zoo.sample_specs(
                    family, plan.specs_per_size * plan.oversample, plan.seed, size=size
                )
            except (zoo.InvalidSpecError, zoo.SamplerExhaustedError):
                continue
    return drawn
