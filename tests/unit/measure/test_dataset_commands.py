"""`kubeseer dataset stats|export|merge|repeat` through the package's own entry point."""

import csv
import json

from kubeseer.measure import __main__ as entry
from kubeseer.measure import commands, records, repeat, storage


def test_stats_counts_rows_per_family_mode_batch_and_flops_decade(tmp_path, make_record, capsys):
    storage.write_part(
        tmp_path,
        [
            make_record(),
            make_record(batch_size=1, mode="infer", optimizer="none", flops=3_000_000),
            make_record(family="vit", config_hash="f" * 16),
        ],
    )
    assert entry.main(["stats", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("3 rows, 2 distinct specs")
    for title in ("family", "mode", "batch size", "FLOPs decade"):
        assert title in out
    assert "1e4" in out and "1e6" in out


def test_stats_can_print_markdown_tables(make_record):
    text = commands.format_stats([make_record()], markdown=True)
    assert "| family | rows |" in text and "| mlp | 1 |" in text


def test_export_writes_every_schema_column_as_csv(tmp_path, make_record):
    storage.write_part(tmp_path / "ds", [make_record()])
    out = tmp_path / "rows.csv"
    assert entry.main(["export", str(tmp_path / "ds"), "--out", str(out)]) == 0
    with out.open() as f:
        (row,) = list(csv.DictReader(f))
    assert list(row) == records.SCHEMA.names
    assert row["memory_bytes"] == "1500000000"


def test_export_jsonl_round_trips_to_the_same_records(tmp_path, make_record):
    storage.write_part(tmp_path / "ds", [make_record()])
    out = tmp_path / "rows.jsonl"
    entry.main(["export", str(tmp_path / "ds"), "--format", "jsonl", "--out", str(out)])
    (line,) = out.read_text().splitlines()
    assert records.from_row(json.loads(line)) == make_record()


def test_merge_reports_rows_per_device(tmp_path, make_record, capsys):
    storage.write_part(tmp_path / "a", [make_record()])
    assert entry.main(["merge", str(tmp_path / "a"), "--out", str(tmp_path / "m")]) == 0
    assert "cuda-nvidia-a100-sxm4-80gb-1g-10gb: 1 rows" in capsys.readouterr().out


def test_a_bad_plan_is_reported_without_a_traceback(tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: x\nmodes: [serve]\n")
    code = entry.main(["collect", "--device", "cpu", "--plan", str(plan), "--out", str(tmp_path)])
    assert code == 2
    assert "bad plan" in capsys.readouterr().err


def test_repeatability_is_the_relative_difference_of_matching_rows(make_record):
    first = [make_record(step_time_median_s=0.100), make_record(batch_size=2)]
    second = [make_record(step_time_median_s=0.101), make_record(batch_size=2)]
    result = repeat.spread(first, second, "step_time_median_s", 2.0)
    assert result.pairs == 2
    assert abs(result.p90_percent - 1.0) < 1e-9
    assert result.share_within == 1.0
    assert "| step_time_median_s | 2 |" in repeat.report(first, second)


def test_repeats_are_drawn_across_families_and_skip_censored_rows(make_record):
    rows = [make_record(config_hash=f"{i:016x}") for i in range(5)]
    rows += [make_record(family="vit", config_hash="v" * 16)]
    rows += [make_record(family="bert", status=records.Status.OUT_OF_MEMORY)]
    chosen = repeat.pick(rows, 2, seed=0)
    assert {r.family for r in chosen} == {"mlp", "vit"}


def test_collect_measures_caches_flops_and_compacts(tmp_path, tiny_plan_path, capsys):
    argv = ["collect", "--device", "cpu", "--plan", str(tiny_plan_path), "--out", str(tmp_path)]
    assert entry.main([*argv, "--limit", "1", "--quiet"]) == 0
    assert entry.main([*argv, "--limit", "1", "--quiet"]) == 0
    assert "1 measured (0 censored), 1 already stored" in capsys.readouterr().err
    (dataset,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(storage.part_files(dataset)) == 1
    assert len(storage.read_records(dataset)) == 2
    assert json.loads((tmp_path / commands.FLOPS_CACHE).read_text())


def test_compare_reports_the_spread_between_two_datasets(tmp_path, make_record, capsys):
    storage.write_part(tmp_path / "a", [make_record(step_time_median_s=0.100)])
    storage.write_part(tmp_path / "b", [make_record(step_time_median_s=0.103)])
    assert entry.main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "| step_time_median_s | 1 | 3.00 % | 3.00 % | 2 % | 0 % |" in capsys.readouterr().out


def test_flops_decades_are_listed_in_numeric_order(make_record):
    rows = [
        make_record(flops=f, config_hash=f"{i:016x}") for i, f in enumerate((30_000_000_000, 5_000))
    ]
    text = commands.format_stats(rows, markdown=True)
    assert text.index("| 1e3 |") < text.index("| 1e10 |")
