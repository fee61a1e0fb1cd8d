import argparse

import onnx
import pytest

from kubeseer import zoo
from kubeseer.zoo import commands


def parse(argv):
    parser = argparse.ArgumentParser(prog="kubeseer")
    commands.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_zoo_sample_writes_spec_lines_and_one_onnx_file_per_spec(tmp_path, capsys):
    args = parse(
        ["zoo", "sample", "--family", "mlp", "--n", "2", "--seed", "4", "--out", str(tmp_path),
         "--size", "tiny", "--no-weights"]
    )  # fmt: skip
    assert args.handler(args) == 0
    lines = (tmp_path / commands.SPECS_FILE).read_text().splitlines()
    specs = [zoo.ModelSpec.from_json(line) for line in lines]
    assert specs == zoo.sample_specs("mlp", 2, 4, size="tiny")
    assert lines == [spec.to_json() for spec in specs]
    for spec in specs:
        proto = onnx.load(str(tmp_path / f"{spec.config_hash()}.onnx"), load_external_data=False)
        assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert not list(tmp_path.glob("*.data"))
    assert "wrote 2 specs" in capsys.readouterr().out


def test_zoo_sample_rejects_unknown_families_and_non_positive_counts():
    with pytest.raises(SystemExit):
        parse(["zoo", "sample", "--family", "alexnet", "--n", "1", "--seed", "0", "--out", "x"])
    with pytest.raises(SystemExit):
        parse(["zoo", "sample", "--family", "mlp", "--n", "0", "--seed", "0", "--out", "x"])


def test_zoo_list_prints_every_standard_spec_with_its_parameter_count(capsys):
    args = parse(["zoo", "list"])
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    for name in zoo.STANDARD_SPECS:
        assert name in out
    assert "25,557,032" in out
