import pytest
import torch

from kubeseer import zoo
from kubeseer.zoo.families import llama

IMAGE = zoo.ModelSpec(
    "resnet",
    {
        "block": "basic",
        "layers": [1, 1],
        "widths": [8, 16],
        "stem_width": 8,
        "groups": 1,
        "width_per_group": 64,
        "num_classes": 10,
    },
    {"image_size": 32, "channels": 3},
)
TOKENS = zoo.ModelSpec(
    "gpt",
    {"layers": 1, "hidden": 16, "heads": 2, "ffn": 32, "max_positions": 16},
    {"seq_len": 12, "vocab_size": 50},
)
FEATURES = zoo.ModelSpec(
    "mlp",
    {"hidden": [8], "activation": "relu", "norm": "batch", "num_classes": 3},
    {"features": 5},
)


def test_image_batch_is_nchw_with_class_targets():
    (x,), y = zoo.example_batch(IMAGE, 4)
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (4,) and y.dtype == torch.int64 and int(y.max()) < 10
    assert zoo.build_model(IMAGE)(x).shape == (4, 10)


def test_token_batch_is_ids_with_per_token_targets():
    (ids,), y = zoo.example_batch(TOKENS, 3)
    assert ids.shape == (3, 12) and ids.dtype == torch.int64 and int(ids.max()) < 50
    assert y.shape == (3, 12)
    assert zoo.build_model(TOKENS)(ids).shape == (3, 12, 50)


def test_feature_batch_is_flat_vectors_with_class_targets():
    (x,), y = zoo.example_batch(FEATURES, 6)
    assert x.shape == (6, 5) and y.shape == (6,)
    assert zoo.build_model(FEATURES)(x).shape == (6, 3)


def test_example_batch_is_seeded():
    (a,), ta = zoo.example_batch(IMAGE, 2)
    (b,), tb = zoo.example_batch(IMAGE, 2)
    (c,), _ = zoo.example_batch(IMAGE, 2, seed=1)
    assert torch.equal(a, b) and torch.equal(ta, tb)
    assert not torch.equal(a, c)


def test_example_batch_rejects_empty_batches():
    with pytest.raises(ValueError, match="batch_size"):
        zoo.example_batch(IMAGE, 0)


@pytest.mark.parametrize("spec", [IMAGE, TOKENS, FEATURES], ids=lambda s: s.family)
def test_training_loss_is_a_differentiable_scalar(spec):
    model = zoo.build_model(spec)
    inputs, target = zoo.example_batch(spec, 2)
    loss = zoo.training_loss(spec, model(*inputs), target)
    loss.backward()
    assert loss.shape == ()
    assert all(p.grad is not None for p in model.parameters())


def test_training_loss_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"\(B, S, V\)"):
        zoo.training_loss(TOKENS, torch.zeros(2, 50), torch.zeros(2, 12, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"\(B, classes\)"):
        zoo.training_loss(IMAGE, torch.zeros(2, 10), torch.zeros(3, dtype=torch.int64))


def test_gpt_attention_is_causal():
    model = zoo.build_model(TOKENS).eval()
    (ids,), _ = zoo.example_batch(TOKENS, 1)
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 50
    with torch.no_grad():
        before, after = model(ids), model(changed)
    torch.testing.assert_close(before[:, :-1], after[:, :-1])
    assert not torch.allclose(before[:, -1], after[:, -1])


LLAMA = zoo.ModelSpec(
    "llama",
    {"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn": 48, "max_positions": 16,
     "tie_embeddings": False},
    {"seq_len": 12, "vocab_size": 50},
)  # fmt: skip


def test_llama_attention_is_causal_and_trains():
    model = zoo.build_model(LLAMA).eval()
    (ids,), target = zoo.example_batch(LLAMA, 2)
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 50
    with torch.no_grad():
        before, after = model(ids), model(changed)
    torch.testing.assert_close(before[:, :-1], after[:, :-1])
    assert not torch.allclose(before[:, -1], after[:, -1])
    loss = zoo.training_loss(LLAMA, zoo.build_model(LLAMA)(ids), target)
    assert loss.shape == ()


def test_llama_rotary_scores_depend_on_relative_position_only():
    # the same query and key vector at every position: after rotation their score is a
    # function of the offset between the two positions, and differs between offsets
    generator = torch.Generator().manual_seed(0)
    query, key = torch.randn(2, 1, 1, 1, 8, generator=generator).expand(2, 1, 1, 6, 8)
    cos, sin = llama.rotary_tables(6, 8, torch.device("cpu"))
    scores = llama.rotate(query, cos, sin) @ llama.rotate(key, cos, sin).transpose(-2, -1)
    scores = scores[0, 0]
    torch.testing.assert_close(scores[1:, 1:], scores[:-1, :-1])
    assert not torch.allclose(scores[0, 0], scores[0, 1])


def test_llama_shares_each_key_and_value_head_among_its_query_heads():
    model = zoo.build_model(LLAMA)
    attention = model.layers[0].self_attn
    assert attention.k_proj.weight.shape == (2 * 8, 32)  # kv_heads x head_dim
    assert attention.q_proj.weight.shape == (4 * 8, 32)
    tied = zoo.ModelSpec("llama", {**LLAMA.arch, "tie_embeddings": True}, LLAMA.input)
    head = 32 * 50
    assert zoo.parameter_count(LLAMA) - zoo.parameter_count(tied) == head


def test_build_on_meta_device_allocates_no_weights():
    with torch.device("meta"):
        model = zoo.build_model(zoo.standard_spec("vgg11"))
    assert all(p.is_meta for p in model.parameters())


@pytest.mark.parametrize(
    ("family", "arch", "inputs", "message"),
    [
        ("vgg", {"stages": [[8]] * 3, "batch_norm": False, "pool_size": 7, "classifier": [],
                 "num_classes": 2}, {"image_size": 32, "channels": 3}, "not a multiple of pool"),
        ("vit", {"patch_size": 5, "layers": 1, "hidden": 8, "heads": 2, "ffn": 8,
                 "num_classes": 2}, {"image_size": 32, "channels": 3}, "multiple of arch.patch"),
        ("bert", {"layers": 1, "hidden": 10, "heads": 3, "ffn": 8, "max_positions": 8,
                  "type_vocab": 2}, {"seq_len": 4, "vocab_size": 9}, "multiple of arch.heads"),
        ("gpt", {"layers": 1, "hidden": 8, "heads": 2, "ffn": 8, "max_positions": 8},
         {"seq_len": 9, "vocab_size": 9}, "exceeds arch.max_positions"),
        ("densenet", {"growth_rate": 4, "block_config": [1] * 6, "num_init_features": 8,
                      "bn_size": 2, "num_classes": 2}, {"image_size": 16, "channels": 3},
         "vanishes"),
        ("inception", {"stem": [8, 8, 8], "stages": [[[4] * 6]] * 3, "big_kernel": 5,
                       "num_classes": 2}, {"image_size": 32, "channels": 3}, "too small"),
        ("resnext", {"block": "bottleneck", "layers": [1], "widths": [8], "stem_width": 8,
                     "groups": 2, "width_per_group": 4, "num_classes": 2},
         {"image_size": 32, "channels": 3}, "per-group width"),
        ("mobilenet_v2", {"stem": 8, "settings": [[6, 8, 1, 3]], "last_channel": 16,
                          "num_classes": 2}, {"image_size": 32, "channels": 3}, "stride"),
        ("mlp", {"hidden": [4], "activation": "swish", "norm": "none", "num_classes": 2},
         {"features": 3}, "activation"),
        ("llama", {**LLAMA.arch, "kv_heads": 3}, LLAMA.input, "multiple of arch.kv_heads"),
        ("llama", {**LLAMA.arch, "hidden": 36, "heads": 12, "kv_heads": 12}, LLAMA.input,
         "must be even"),
    ],
)  # fmt: skip
def test_family_rejects_specs_that_cannot_build(family, arch, inputs, message):
    with pytest.raises(zoo.InvalidSpecError, match=message):
        zoo.ModelSpec(family, arch, inputs)
