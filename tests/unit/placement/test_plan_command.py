"""`kubeseer plan` on a real ONNX model with the shipped checkpoint (no cluster)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import yaml

from kubeseer import cli

RESNET50 = (
    Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"
)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["plan", str(RESNET50), "--batch", "1", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_is_the_plan_as_status_stores_it_with_the_prediction(capsys):
    code, out, _ = run(capsys, "--mode", "infer", "--gpu", "A100-40GB", "--json")
    assert code == 0
    made = json.loads(out)
    plan, prediction = made["plan"], made["prediction"]
    assert plan["needMiB"] == -(-prediction["memoryUpperBytes"] // (1 << 20))
    # The checkpoint learned no SM utilisation, so each slice's slowdown is derived from the
    # step's work (hardware.scaling): fewer SMs and less bandwidth, a longer step.
    assert prediction["unlearned"] == ["sm_util_percent"]
    assert {r["slowdownEvidence"] for r in plan["rows"]} == {"derived"}
    slowdown = {r["profile"]: r["slowdown"] for r in plan["rows"]}
    assert slowdown["whole"] == 1.0
    ladder = ["1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    assert [slowdown[p] for p in ladder] == sorted((slowdown[p] for p in ladder), reverse=True)
    assert slowdown["1g.10gb"] > slowdown["2g.10gb"] > slowdown["7g.40gb"] >= 1.0
    # A100-40GB: six profiles and the whole GPU; the rungs that fit ranked first, by cost.
    assert [r["rank"] for r in plan["rows"] if r["fits"]] == list(range(1, plan["rungs"] + 1))
    costs = [r["cost"] for r in plan["rows"] if r["fits"]]
    assert costs == sorted(costs)
    assert len(plan["rows"]) == 7
    assert not any(r["chosen"] for r in plan["rows"])


def test_yaml_is_a_dljob_pinning_the_model_and_the_claim_template_of_its_ladder(capsys):
    code, out, _ = run(
        capsys,
        "--mode",
        "train",
        "--gpu",
        "H100-80GB-SXM",
        "--replicas",
        "2",
        "--url",
        "https://models.example.org/resnet50.onnx",
        "--yaml",
    )
    assert code == 0
    dljob, template = yaml.safe_load_all(out)
    assert dljob["kind"] == "DLJob" and dljob["metadata"]["name"] == "light-resnet50"
    spec = dljob["spec"]
    assert spec["model"]["url"] == "https://models.example.org/resnet50.onnx"
    assert len(spec["model"]["sha256"]) == 64
    assert (spec["mode"], spec["batchSize"], spec["replicas"]) == ("train", 1, 2)
    assert spec["placement"]["gpuProducts"] == ["H100-80GB-SXM"]
    assert template["kind"] == "ResourceClaimTemplate"
    rungs = template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert rungs[0]["name"] == "r1-h100-80gb-sxm-1g-10gb"
    assert rungs[-1]["deviceClassName"] == "gpu.nvidia.com"


def test_the_table_lists_every_candidate_and_says_what_cost_means(capsys):
    code, out, _ = run(capsys, "--mode", "infer", "--gpu", "H100-NVL")
    assert code == 0
    assert "1g.12gb" in out and "whole" in out
    assert "cost = share of the GPU held" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "infer", "--gpu", "B200"], "unknown GPU product 'B200'"),
        (["--mode", "infer", "--max-slowdown", "0.5"], "maxSlowdown must be"),
        (["--mode", "infer", "--coverage", "0.99"], "use --coverage 0.95 or less"),
    ],
)
def test_bad_options_are_one_line_and_exit_code_2(capsys, args, message):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1


def test_a_file_that_is_not_a_model_is_one_line_and_exit_code_2(capsys, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf at all")
    code = cli.main(["plan", str(bad), "--batch", "8", "--mode", "infer"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith(f"kubeseer plan: {bad}: ") and err.count("\n") == 1
