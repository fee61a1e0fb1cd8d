from pathlib import Path

import pytest

from kubeseer import zoo
from kubeseer.measure import plans, records, steps

PLANS = Path(__file__).resolve().parents[3] / "plans"
BASE = {
    "name": "t",
    "families": ["mlp", "vit"],
    "sizes": ["tiny"],
    "specs_per_size": 4,
    "oversample": 2,
    "configs_per_spec": 4,
    "batch_sizes": [1, 2, 4, 8],
    "modes": ["infer", "train"],
    "precisions": ["fp32", "bf16"],
    "optimizers": ["sgd", "adam"],
}


def decade_counter(spec: zoo.ModelSpec) -> tuple[int, int]:
    """Spreads specs over four FLOPs decades by their hash, without building anything."""
    return 10 ** (3 + int(spec.config_hash(), 16) % 4), 1


def test_a_plan_expands_to_the_same_tasks_every_time():
    plan = plans.parse_plan(BASE)
    first = plans.expand(plan, decade_counter).tasks
    assert first == plans.expand(plan, decade_counter).tasks
    assert len(first) == 2 * 4 * 4


def test_every_family_mode_and_decade_of_the_candidates_is_covered():
    plan = plans.parse_plan(BASE)
    tasks = plans.expand(plan, decade_counter).tasks
    for family in BASE["families"]:
        candidates = zoo.sample_specs(family, 8, 0, size="tiny")
        decades = {plans.flops_decade(decade_counter(s)[0]) for s in candidates}
        mine = [t for t in tasks if t.task.spec.family == family]
        assert {plans.flops_decade(t.flops) for t in mine} == decades
        assert {t.task.mode for t in mine} == {"infer", "train"}


def test_inference_tasks_have_no_optimizer_and_training_tasks_name_one():
    tasks = plans.expand(plans.parse_plan(BASE), decade_counter).tasks
    for planned in tasks:
        if planned.task.mode == "infer":
            assert planned.task.optimizer == records.NO_OPTIMIZER
        else:
            assert planned.task.optimizer in ("sgd", "adam")


def test_tasks_alternate_families_so_a_cut_short_run_covers_all():
    tasks = plans.expand(plans.parse_plan(BASE), decade_counter).tasks
    assert [t.task.spec.family for t in tasks[:4]] == ["mlp", "vit", "mlp", "vit"]


def test_the_step_flops_cap_drops_only_configurations_over_it():
    plan = plans.parse_plan({**BASE, "max_step_flops": 2.0e4})
    for planned in plans.expand(plan, decade_counter).tasks:
        task = planned.task
        assert plans.step_flops(planned.flops, task.batch_size, task.mode) <= 2.0e4


def test_specs_whose_model_cannot_be_built_are_reported_not_planned():
    def failing(spec: zoo.ModelSpec) -> tuple[int, int]:
        raise RuntimeError("cannot build")

    expansion = plans.expand(plans.parse_plan(BASE), failing)
    assert expansion.tasks == ()
    assert len(expansion.rejected) == 16
    assert "cannot build" in expansion.rejected[0][1]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"modes": ["serve"]}, "modes"),
        ({"batch_sizes": [0]}, "batch_sizes"),
        ({"families": ["lenet"]}, "families"),
        ({"warmup": 2}, "warmup"),
        ({"iterations": 10}, "iterations"),
        ({"colour": "blue"}, "unknown plan fields"),
        ({"max_step_flops": -1}, "max_step_flops"),
    ],
)
def test_invalid_plans_are_rejected_with_the_field_named(change, message):
    with pytest.raises(plans.PlanError, match=message):
        plans.parse_plan({**BASE, **change})


def test_shipped_plans_parse_and_the_gpu_plan_has_tens_of_thousands_of_configs():
    sizes = {}
    for path in sorted(PLANS.glob("*.yaml")):
        plan = plans.load_plan(path)
        sizes[plan.name] = (
            len(plan.families) * len(plan.sizes) * plan.specs_per_size * plan.configs_per_spec
        )
    assert sizes["gpu-full"] >= 20_000
    assert sizes["cpu-small"] >= 2_000
    assert sizes["tiny"] <= 8


@pytest.mark.slow  # each worker pays torch's first-dispatch warm-up: seconds on a loaded machine
def test_counting_in_worker_processes_matches_counting_in_process(tmp_path):
    specs = zoo.sample_specs("mlp", 3, 0, size="tiny")
    parallel = plans.CachedCounter(tmp_path / "cache.json")
    parallel.prefill(specs, workers=2)
    parallel.save()
    reloaded = plans.CachedCounter(tmp_path / "cache.json", counter=decade_counter)
    for spec in specs:
        assert reloaded(spec) == steps.count_flops_and_params(spec)
