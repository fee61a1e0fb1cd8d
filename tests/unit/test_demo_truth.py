"""The demo's observed memory: the example's own model, derived, never the prediction."""

import base64

import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from kubeseer import demo_truth, resources

MIB = 1 << 20
EXAMPLES = resources.path("examples")


def example(name):
    config_map, job = list(yaml.safe_load_all((EXAMPLES / f"{name}.yaml").read_text()))
    model = onnx.load_from_string(base64.b64decode(config_map["binaryData"]["model.onnx"]))
    return model, job["spec"]


def test_each_example_reads_back_as_the_zoo_mlp_of_its_layers():
    spec = demo_truth.mlp_spec(example("mlp-train-whole-gpu")[0])
    assert (spec.family, spec.input) == ("mlp", {"features": 16384})
    assert spec.arch == {
        "hidden": (16384,) * 12,
        "activation": "relu",
        "norm": "none",
        "num_classes": 1000,
    }
    replicas = demo_truth.mlp_spec(example("mlp-train-replicas")[0])
    assert (replicas.arch["hidden"], replicas.arch["num_classes"]) == ((2048,) * 3, 10)
    assert replicas.input == {"features": 1024}


def graph(nodes, initializers):
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, ["batch", 4])],
        initializers,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def weight(name, *dims):
    return helper.make_tensor(name, TensorProto.FLOAT, list(dims), [0.0] * (dims[0] * dims[1]))


def test_a_model_that_is_not_a_gemm_relu_chain_is_refused_naming_the_node():
    model = graph(
        [
            helper.make_node("Gemm", ["x", "w0"], ["h0"]),
            helper.make_node("Sigmoid", ["h0"], ["a0"]),
            helper.make_node("Gemm", ["a0", "w1"], ["y"]),
        ],
        [weight("w0", 8, 16), weight("w1", 16, 4)],
    )
    with pytest.raises(demo_truth.NotDerivableError, match="node 1 is Sigmoid"):
        demo_truth.mlp_spec(model)


def test_layers_whose_widths_do_not_chain_are_refused():
    model = graph(
        [
            helper.make_node("Gemm", ["x", "w0"], ["h0"]),
            helper.make_node("Relu", ["h0"], ["a0"]),
            helper.make_node("Gemm", ["a0", "w1"], ["y"]),
        ],
        [weight("w0", 8, 16), weight("w1", 32, 4)],
    )
    with pytest.raises(demo_truth.NotDerivableError, match="width 16 feeds one expecting 32"):
        demo_truth.mlp_spec(model)


def test_nvml_shows_the_reserve_on_a_roomy_device_and_the_job_runs_out_on_a_small_one():
    model, spec = example("mlp-train-slice")  # fp16 autocast training of 270M parameters
    roomy = demo_truth.derive(model, spec, "NVIDIA-A100-SXM4-80GB", 20 * 1024 * MIB)
    assert roomy.runtime == "torch2-cuda12"
    assert roomy.observed_bytes is not None
    # Adam keeps weights, gradients and two moments in fp32: 16 bytes a parameter at least.
    assert roomy.required_bytes > 16 * 270e6
    assert roomy.required_bytes <= roomy.observed_bytes < 20 * 1024 * MIB
    tight = demo_truth.derive(model, spec, "NVIDIA-A100-SXM4-80GB", roomy.required_bytes)
    assert tight.observed_bytes is not None and tight.observed_bytes <= roomy.required_bytes
    small = demo_truth.derive(model, spec, "NVIDIA-A100-SXM4-80GB", roomy.required_bytes - 64 * MIB)
    assert small.out_of_memory and small.required_bytes == roomy.required_bytes


def test_a_hopper_gpu_adds_its_larger_cublas_workspace():
    model, spec = example("mlp-infer-small")
    a100 = demo_truth.derive(model, spec, "NVIDIA-A100-SXM4-80GB", 80 * 1024 * MIB)
    h100 = demo_truth.derive(model, spec, "NVIDIA-H100-80GB-HBM3", 80 * 1024 * MIB)
    assert h100.runtime == "torch2-cuda12-hopper"
    assert h100.required_bytes > a100.required_bytes
