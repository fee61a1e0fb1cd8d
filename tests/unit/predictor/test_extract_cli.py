"""`kubeseer graph`: table, JSON and one-line errors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import onnx
import pytest

from kubeseer.predictor import commands, schema

SQUEEZENET = Path(onnx.__file__).parent / "backend/test/data/light/light_squeezenet.onnx"


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="kubeseer")
    commands.register(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    return int(args.handler(args))


def test_json_summary_has_counts_dimensions_and_named_globals(capsys):
    assert run("graph", str(SQUEEZENET), "--batch", "1", "--json", "--top", "3") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["node_feature_dim"] == len(schema.NODE_FEATURES)
    assert report["edge_feature_dim"] == len(schema.EDGE_FEATURES)
    assert set(report["global_features"]) == set(schema.GLOBAL_FEATURES)
    assert report["num_nodes"] == report["global_features"]["num_nodes"] > 0
    assert report["num_edges"] == report["global_features"]["num_edges"]
    assert report["flops"] == report["global_features"]["flops_total"]
    assert report["params"] > 1_000_000
    flops = [op["flops"] for op in report["top_operators"]]
    assert len(flops) == 3 and flops == sorted(flops, reverse=True)


def test_table_lists_totals_and_top_operators(capsys):
    assert run("graph", str(SQUEEZENET), "--batch", "1") == 0
    out = capsys.readouterr().out
    assert "GFLOPs" in out and "top 10 operators by FLOPs" in out and "Conv" in out


def test_bad_model_is_one_line_on_stderr_and_exit_code_2(tmp_path, capsys):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"definitely not protobuf \xff\xff")
    assert run("graph", str(junk), "--batch", "1") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not an ONNX model" in err


def test_a_fixed_batch_model_is_rebound_and_the_warning_says_so(capsys):
    assert run("graph", str(SQUEEZENET), "--batch", "4") == 0
    err = capsys.readouterr().err
    assert "warning: the model was exported with a fixed batch size of 1" in err
    assert "rebound to 4" in err


@pytest.mark.parametrize("bad", ["seq", "seq=", "=4", "seq=0", "seq=x"])
def test_malformed_input_bindings_are_usage_errors(bad, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run("graph", str(SQUEEZENET), "--batch", "1", "--input", bad)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--input" in err and ("NAME=VALUE" in err or "must be" in err or "integer" in err)
