import math

import pytest
import torch
from test_api import tiny_onnx

from kubeseer import prediction
from kubeseer.hardware import mig
from kubeseer.predictor import cost_model, device, errors, extract, schema


def test_features_are_the_logs_of_the_devices_specs_at_the_jobs_precision():
    h100 = mig.device("H100-SXM5-80GB")
    made = device.features(h100, "fp16")[0]
    expected = [
        math.log(989.5e12),  # tensor cores, fp16 with fp32 accumulate
        math.log(67.0e12),
        math.log(3350e9),
        math.log(132),
        math.log(50 * (1 << 20)),
        math.log(989.5e12 / 3350e9),
    ]
    assert made.tolist() == pytest.approx(expected, rel=1e-6)
    # fp32 matrix products run at TF32 (cuDNN's default for convolutions).
    assert device.features(h100, "fp32")[0, 0].item() == pytest.approx(math.log(494.5e12))


def test_a_mig_slice_has_its_share_of_sms_bandwidth_and_l2():
    whole = device.features(mig.device("H100-SXM5-80GB"), "fp16")[0]
    part = device.features(device.resolve("H100-80GB-SXM/3g.40gb"), "fp16")[0]
    assert part[3].exp().item() == pytest.approx(60)
    assert (part[0] - whole[0]).exp().item() == pytest.approx(60 / 132, rel=1e-5)
    assert (part[2] - whole[2]).exp().item() == pytest.approx(4 / 8, rel=1e-5)


def test_resolve_names_a_gpu_or_a_slice_and_refuses_what_the_table_lacks():
    assert device.resolve("a100-80gb").name == "A100-PCIE-80GB"
    assert device.resolve("NVIDIA H100 80GB HBM3/nvidia.com/mig-1g.10gb").name == (
        "H100-SXM5-80GB/1g.10gb"
    )
    with pytest.raises(errors.PredictionError, match="unknown GPU"):
        device.resolve("Voodoo-5")
    with pytest.raises(errors.PredictionError, match="no MIG profile"):
        device.resolve("RTX-4090/1g.10gb")


def test_the_steps_work_counts_three_passes_in_training_and_half_width_bytes_under_autocast():
    graph = extract.from_onnx(tiny_onnx(), batch_size=8)
    infer = device.work(graph, prediction.Mode.INFER, "fp32")
    assert (infer.flops, infer.bytes_moved, infer.kernels) == (
        graph.flops,
        graph.mac,
        graph.num_nodes,
    )
    trained = device.work(graph, prediction.Mode.TRAIN, "fp16")
    assert trained.flops == pytest.approx(3 * graph.flops)
    assert trained.bytes_moved == pytest.approx(3 * 0.5 * graph.mac)
    assert trained.kernels == 3 * graph.num_nodes


def test_device_terms_are_the_work_in_seconds_at_the_devices_peaks():
    x = torch.zeros(2, len(schema.NODE_FEATURES), dtype=torch.float32)
    col = {name: i for i, name in enumerate(schema.NODE_FEATURES)}
    # A matrix product (reduction length K) of 1e12 FLOPs moving 1e9 bytes, and an elementwise
    # operator of 1e9 FLOPs moving 4e9 bytes.
    x[0, col["gemm_k"]], x[0, col["flops"]], x[0, col["mac_bytes"]] = 64, 1e12, 1e9
    x[1, col["flops"]], x[1, col["mac_bytes"]] = 1e9, 4e9
    x = torch.log1p(x.double()).float()
    h100 = mig.device("H100-SXM5-80GB")
    values = cost_model.device_terms(x, h100, "fp16")[0]
    terms = dict(zip(cost_model.DEVICE_TERMS, values, strict=True))
    assert terms["matmul_flops_at_peak"] == pytest.approx(1e12 / 989.5e12, rel=1e-4)
    assert terms["other_flops_at_fp32_peak"] == pytest.approx(1e9 / 67e12, rel=1e-4)
    assert terms["matmul_bytes_at_bandwidth"] == pytest.approx(0.5 * 1e9 / 3350e9, rel=1e-4)
    assert terms["other_bytes_at_bandwidth"] == pytest.approx(0.5 * 4e9 / 3350e9, rel=1e-4)
    assert terms["matmul_operators"] == terms["other_operators"] == pytest.approx(1)
    assert terms["step"] == 1


def test_a_device_cost_model_fitted_on_two_gpus_predicts_a_third_from_its_specs():
    g = torch.Generator().manual_seed(0)
    truth = torch.zeros(len(cost_model.DEVICE_TERMS), dtype=torch.float64)
    truth[cost_model.DEVICE_TERMS.index("matmul_flops_at_peak")] = 0.8
    truth[cost_model.DEVICE_TERMS.index("other_bytes_at_bandwidth")] = 1.1
    truth[cost_model.DEVICE_TERMS.index("step")] = 3e-3

    def rows(gpu: str, n: int) -> torch.Tensor:
        out = []
        for _ in range(n):
            x = torch.zeros(2, len(schema.NODE_FEATURES), dtype=torch.float64)
            x[0, schema.NODE_FEATURES.index("gemm_k")] = 64
            x[0, schema.NODE_FEATURES.index("flops")] = 10 ** (10 + 3 * torch.rand(1, generator=g))
            x[1, schema.NODE_FEATURES.index("mac_bytes")] = 10 ** (
                8 + 2 * torch.rand(1, generator=g)
            )
            out.append(cost_model.device_terms(torch.log1p(x), mig.device(gpu), "fp16"))
        return torch.cat(out)

    seen = torch.cat([rows("RTX-3090", 40), rows("RTX-4090", 40)])
    fitted = cost_model.StepCostModel.fit(seen, seen @ truth, ["infer"] * 80)
    assert fitted.terms == cost_model.DEVICE_TERMS
    unseen = rows("H100-SXM5-80GB", 20)
    predicted = fitted.log_estimate("infer", unseen).exp()
    torch.testing.assert_close(predicted, unseen @ truth, rtol=0.02, atol=0)
    assert cost_model.StepCostModel.from_dict(fitted.to_dict()) == fitted
