"""A new predictor checkpoint serves without a restart, and every prediction names its checkpoint
(issue 21): the file is followed, a broken file never replaces a working checkpoint, and a swap
in the middle of a run gives the next DLJob the new checkpoint's prediction."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
from onnx import TensorProto, helper

from kubeseer.operator import checkpoints, main
from kubeseer.operator.config import ConfigError, OperatorConfig
from kubeseer.prediction import Mode, Precision
from kubeseer.predictor import api, checkpoint


class Labelled:
    """A predictor that answers with `base`'s prediction under its own version, remembering
    what it was asked (each instance stands for one loaded checkpoint)."""

    def __init__(self, base: Any, version: str) -> None:
        self.base = base
        self.version = version
        self.asked = 0

    def cached(self, *args: Any, **kwargs: Any) -> Any:
        return None

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        self.asked += 1
        return dataclasses.replace(self.base, predictor_version=self.version)


def write(path: Path, text: str) -> None:
    """Replace the file as a ConfigMap volume or `kubectl cp` would: a new file moved in."""
    fresh = path.with_suffix(".new")
    fresh.write_text(text)
    os.replace(fresh, path)


def test_a_changed_file_serves_the_next_prediction_and_a_broken_one_never_does(
    tmp_path: Path, prediction: Any
) -> None:
    path = tmp_path / "seernet.pt"
    write(path, "v1")
    loads: list[str] = []

    def load(at: Path) -> checkpoints.Loaded:
        text = at.read_text()
        loads.append(text)
        if text == "broken":
            raise ValueError("not a readable checkpoint")
        return checkpoints.Loaded(Labelled(prediction(), "kubeseer"), f"checkpoint {text}")

    swapping = checkpoints.SwappingPredictor(path, load, load(path))
    before = swapping.predict(b"model", 8, Mode.INFER, Precision.FP32, inputs={})
    assert before.predictor_version == "kubeseer, checkpoint v1"
    assert not swapping.check()  # unchanged: nothing loaded again
    write(path, "broken")
    assert not swapping.check()
    assert swapping.name == "checkpoint v1"
    assert not swapping.check()  # the same broken file is not tried again
    write(path, "v2")
    assert swapping.check()
    after = swapping.predict(b"model", 8, Mode.INFER, Precision.FP32, inputs={})
    assert after.predictor_version == "kubeseer, checkpoint v2"
    assert loads == ["v1", "broken", "v2"]
    path.unlink()
    assert not swapping.check() and swapping.name == "checkpoint v2"


def mlp_onnx() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 512])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 512])
    w = helper.make_tensor("w", TensorProto.FLOAT, [512, 512], [0.0] * (512 * 512))
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mlp", [x], [y], [w])
    return bytes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    )


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The shipped checkpoint, and a copy recalibrated to wider margins (as a retraining run
    would publish: another fingerprint, other bounds)."""
    root = tmp_path_factory.mktemp("checkpoints")
    shipped = checkpoint.load(api.default_checkpoint_path())
    wider = dataclasses.replace(
        shipped.calibration, log_margins=tuple(m + 0.5 for m in shipped.calibration.log_margins)
    )
    retrained = dataclasses.replace(shipped, calibration=wider, notes="recalibrated")
    return (
        checkpoint.save(shipped, root / "a.pt"),
        checkpoint.save(retrained, root / "b.pt"),
    )


def test_a_checkpoint_swapped_mid_run_predicts_the_next_dljob_and_names_itself(
    make_world: Any, tmp_path: Path, two_checkpoints: tuple[Path, Path]
) -> None:
    first, second = two_checkpoints
    served = tmp_path / "mounted" / "seernet.pt"
    served.parent.mkdir()
    served.write_bytes(first.read_bytes())
    config = OperatorConfig(predictor_checkpoint=served, prediction_cache_size=8)
    swapping = main.load_predictor(config)
    world = make_world()
    world.reconciler.predictor.predictor = swapping
    world.models.sources["resnet"] = mlp_onnx()

    world.reconcile(world.submit("before"))
    old = world.cluster.status("before")["prediction"]
    name_a = f"checkpoint {checkpoint.fingerprint(checkpoint.load(first))[:12]}"
    assert old["predictorVersion"].endswith(name_a)
    assert (
        world.cluster.workloads["before-0"]["metadata"]["annotations"][
            "kubeseer.io/predictor-version"
        ]
        == old["predictorVersion"]
    )

    fresh = served.with_suffix(".new")
    fresh.write_bytes(second.read_bytes())
    os.replace(fresh, served)
    assert swapping.check()
    world.reconcile(world.submit("after"))  # the same model: not served from the old cache
    new = world.cluster.status("after")["prediction"]
    name_b = f"checkpoint {checkpoint.fingerprint(checkpoint.load(second))[:12]}"
    assert name_b != name_a
    assert new["predictorVersion"].endswith(name_b)
    assert new["memoryUpperBytes"] > old["memoryUpperBytes"]
    assert new["memoryPointBytes"] == pytest.approx(old["memoryPointBytes"], rel=1e-6)
    # The DLJob predicted before the swap keeps the prediction, and the name, it was placed by.
    assert world.cluster.status("before")["prediction"] == old


def test_an_unloadable_checkpoint_stops_the_start_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "seernet.pt"
    bad.write_text("not a checkpoint")
    with pytest.raises(ConfigError, match="cannot load the predictor checkpoint"):
        main.load_predictor(OperatorConfig(predictor_checkpoint=bad))
