import json

import pytest

from kubeseer import zoo


def test_round_trip_through_json_preserves_spec_and_hash():
    spec = zoo.standard_spec("resnet50")
    again = zoo.ModelSpec.from_json(spec.to_json())
    assert again == spec
    assert again.config_hash() == spec.config_hash()
    assert hash(again) == hash(spec)


def test_json_is_canonical_regardless_of_key_order():
    spec = zoo.standard_spec("resnet18")
    shuffled = {
        "input": dict(reversed(list(spec.to_dict()["input"].items()))),
        "arch": dict(reversed(list(spec.to_dict()["arch"].items()))),
        "family": spec.family,
    }
    assert zoo.ModelSpec.from_json(json.dumps(shuffled, indent=2)).to_json() == spec.to_json()
    assert " " not in spec.to_json()
    assert list(json.loads(spec.to_json())) == ["arch", "family", "input"]


def test_config_hash_is_pinned_across_processes_and_versions():
    # The hash keys measured datasets on disk: changing it orphans every record.
    assert zoo.standard_spec("resnet50").config_hash() == "50ea67aa9174a54d"


def test_config_hash_is_sixteen_hex_digits_of_sha256():
    import hashlib

    spec = zoo.standard_spec("resnet18")
    digest = hashlib.sha256(spec.to_json().encode()).hexdigest()
    assert spec.config_hash() == digest[:16]


def test_spec_is_immutable_and_detached_from_the_caller_dict():
    arch = dict(zoo.standard_spec("resnet18").arch)
    arch["layers"] = [1, 1, 1, 1]
    spec = zoo.ModelSpec("resnet", arch, {"image_size": 64, "channels": 3})
    arch["layers"].append(1)
    assert spec.to_dict()["arch"]["layers"] == [1, 1, 1, 1]
    with pytest.raises(TypeError):
        spec.arch["layers"] = [2]  # type: ignore[index]


def test_describe_names_family_hash_and_fields():
    spec = zoo.standard_spec("resnet50")
    text = spec.describe()
    assert text.startswith(f"resnet [{spec.config_hash()}]")
    assert "layers=[3,4,6,3]" in text
    assert "image_size=224" in text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"family": "alexnet"}, "unknown family"),
        ({"arch": {"block": "basic"}}, "missing"),
        ({"arch_extra": {"depth": 3}}, "unknown keys"),
        ({"arch_set": ("layers", [3, 0, 6, 3])}, r"arch.layers\[1\]: must be >= 1"),
        ({"arch_set": ("block", "fancy")}, "arch.block: must be one of"),
        ({"arch_set": ("groups", 32)}, "use resnext"),
        ({"arch_set": ("widths", [64, 128])}, "widths has 2"),
        ({"arch_set": ("num_classes", True)}, "must be an integer"),
        ({"arch_set": ("num_classes", float("nan"))}, "finite"),
        ({"input": {"image_size": 224}}, r"input.channels: missing"),
    ],
)
def test_invalid_specs_raise_invalid_spec_error_naming_the_field(change, message):
    data = zoo.standard_spec("resnet50").to_dict()
    if "family" in change:
        data["family"] = change["family"]
    if "arch" in change:
        data["arch"] = change["arch"]
    if "input" in change:
        data["input"] = change["input"]
    if "arch_extra" in change:
        data["arch"].update(change["arch_extra"])
    if "arch_set" in change:
        key, value = change["arch_set"]
        data["arch"][key] = value
    with pytest.raises(zoo.InvalidSpecError, match=message):
        zoo.ModelSpec(data["family"], data["arch"], data["input"])


def test_invalid_spec_error_is_a_value_error():
    assert issubclass(zoo.InvalidSpecError, ValueError)


@pytest.mark.parametrize(
    "text",
    ["", "not json", "[]", '{"family": "resnet"}', '{"family": 1, "arch": {}, "input": {}}'],
)
def test_from_json_rejects_malformed_documents(text):
    with pytest.raises(zoo.InvalidSpecError):
        zoo.ModelSpec.from_json(text)


def test_equality_and_hash_follow_the_canonical_json():
    arch = {"hidden": [8], "activation": "relu", "norm": "none", "num_classes": 2}
    a = zoo.ModelSpec("mlp", arch, {"features": 4})
    b = zoo.ModelSpec("mlp", dict(reversed(list(arch.items()))), {"features": 4})
    c = zoo.ModelSpec("mlp", {**arch, "hidden": [16]}, {"features": 4})
    assert a == b and hash(a) == hash(b)
    assert a != c
    assert len({a, b, c}) == 2
