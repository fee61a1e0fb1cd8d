import pytest

from kubeseer import zoo

# Reference counts: torchvision's builders (ImageNet, 1000 classes, aux heads off),
# Hugging Face's BertForMaskedLM / GPT2LMHeadModel (tied output embeddings), and the published
# Llama checkpoints as Hugging Face's LlamaForCausalLM counts them (TinyLlama 1.1B, Llama 3.2
# 1B and 3B with tied embeddings, Llama 2 7B and 13B, Llama 3 8B).
REFERENCE_PARAMETERS = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "wide_resnet50_2": 68_883_240,
    "resnext50_32x4d": 25_028_904,
    "vgg11": 132_863_336,
    "vgg11_bn": 132_868_840,
    "vgg16": 138_357_544,
    "mobilenet_v2": 3_504_872,
    "mobilenet_v1": 4_231_976,
    "densenet121": 7_978_856,
    "densenet169": 14_149_480,
    "googlenet": 6_624_904,
    "vit-b16": 86_567_656,
    "vit-b32": 88_224_232,
    "bert-base": 109_514_298,
    "gpt2-small": 124_439_808,
    "tinyllama-1.1b": 1_100_048_384,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-2-7b": 6_738_415_616,
    "llama-3-8b": 8_030_261_248,
    "llama-2-13b": 13_015_864_320,
}


@pytest.mark.parametrize(("name", "expected"), sorted(REFERENCE_PARAMETERS.items()))
def test_standard_spec_matches_reference_parameter_count(name, expected):
    assert zoo.parameter_count(zoo.standard_spec(name)) == expected


def test_every_family_has_a_standard_spec():
    families = {zoo.standard_spec(name).family for name in zoo.STANDARD_SPECS}
    assert families == set(zoo.FAMILIES)


def test_bert_base_has_the_published_shape():
    spec = zoo.standard_spec("bert-base")
    assert dict(spec.arch) == {
        "layers": 12,
        "hidden": 768,
        "heads": 12,
        "ffn": 3072,
        "max_positions": 512,
        "type_vocab": 2,
    }
    assert spec.input["vocab_size"] == 30522


def test_unknown_standard_spec_lists_the_known_names():
    with pytest.raises(KeyError, match="resnet50"):
        zoo.standard_spec("resnet51")


def test_parameter_count_allocates_nothing_for_large_models():
    # bert-large on the meta device: counting must not initialise 1.3 GB of weights.
    import tracemalloc

    tracemalloc.start()
    count = zoo.parameter_count(zoo.standard_spec("bert-large"))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == 335_174_458
    assert peak < 50 * 2**20
