"""Linear weights in oneDNN's blocked layout (`models.packed_linear`): the same products up to
float32 rounding, the same answers, and a server packs only the model it loads itself."""

import gc
import weakref

import pytest
import torch

from vidsight.engine import Asker, GenerationConfig
from vidsight.ingest import SamplingConfig
from vidsight.models import load_model
from vidsight.models.packed_linear import PackedLinear, can_pack, pack_linear_weights

from tests.settings import DEVICE, DTYPE, assert_logits_close

needs_packing = pytest.mark.skipif(not can_pack(DEVICE, DTYPE), reason="oneDNN packs float32 weights on a CPU only")


@needs_packing
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 48), (3, 48), (8, 48), (2, 37, 48)], ids=["1 row", "3 rows", "8 rows", "3-d"])
def test_a_packed_layer_multiplies_as_the_plain_one(bias, shape):
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80, bias=bias)
    x = torch.randn(shape)
    packed = PackedLinear(linear)
    with torch.inference_mode():
        ours, reference = packed(x), linear(x)
    assert ours.shape == reference.shape == (*shape[:-1], 80)
    assert torch.allclose(ours, reference, atol=1e-5, rtol=1e-5)
    assert (packed.in_features, packed.out_features, packed.bias is None) == (48, 80, not bias)


@needs_packing
def test_a_packed_model_answers_as_the_plain_one(tiny_adapter, packed_tiny_adapter, make_test_video):
    path, _ = make_test_video(width=176, height=144, duration_s=3.0, seed=5)
    linear = [m for m in packed_tiny_adapter.model.modules() if isinstance(m, (torch.nn.Linear, PackedLinear))]
    assert linear and all(isinstance(m, PackedLinear) for m in linear)   # vision tower, language model, head
    options = dict(sampling=SamplingConfig(fps=2.0), generation=GenerationConfig(max_new_tokens=8))
    plain, packed = Asker(tiny_adapter), Asker(packed_tiny_adapter)
    question = "What colour is the square?"
    assert packed.ask(path, question, **options).token_ids == plain.ask(path, question, **options).token_ids
    assert_logits_close(packed.prefill_logits(path, question, sampling=options["sampling"]),
                        plain.prefill_logits(path, question, sampling=options["sampling"]))


@needs_packing
def test_each_original_weight_is_freed_as_its_layer_is_packed(tiny_model_dir, monkeypatch):
    """Packing never holds two layers' original weights: the weights' memory does not double while
    a 7B is packed. The embedding's matrix, which a tied output head shares, stays for the lookup."""
    import vidsight.models.packed_linear as packing

    adapter = load_model(tiny_model_dir, "cpu", torch.float32)
    originals = [weakref.ref(m.weight) for m in adapter.model.modules() if isinstance(m, torch.nn.Linear)]
    embedding = adapter.model.get_input_embeddings().weight
    alive_at_each_layer = []

    class Counting(PackedLinear):
        def __init__(self, linear):
            gc.collect()
            alive_at_each_layer.append(sum(ref() is not None and ref() is not embedding for ref in originals))
            super().__init__(linear)

    monkeypatch.setattr(packing, "PackedLinear", Counting)
    assert pack_linear_weights(adapter.model, min_elements=0) == len(originals) == len(alive_at_each_layer)
    # Those not packed yet (this one included) and at most one more: not every original to the end.
    assert all(alive <= len(originals) - k + 1 for k, alive in enumerate(alive_at_each_layer))
    gc.collect()
    assert {id(ref()) for ref in originals if ref() is not None} <= {id(embedding)}


def test_weights_that_cannot_be_packed_are_left_as_they_are(tiny_model_dir):
    adapter = load_model(tiny_model_dir, "cpu", torch.bfloat16)
    assert pack_linear_weights(adapter.model, min_elements=0) == 0
    assert not any(isinstance(m, PackedLinear) for m in adapter.model.modules())


@needs_packing
def test_only_large_weights_are_packed():
    from vidsight.models.packed_linear import MIN_PACKED_ELEMENTS

    model = torch.nn.Sequential(torch.nn.Linear(1024, MIN_PACKED_ELEMENTS // 1024), torch.nn.Linear(1024, 64))
    assert pack_linear_weights(model) == 1
    assert [type(m) for m in model] == [PackedLinear, torch.nn.Linear]


@needs_packing
@pytest.mark.parametrize("packed_weights", [True, False])
def test_a_server_packs_the_model_it_loads_but_not_one_handed_to_it(tiny_model_dir, tiny_adapter, tmp_path,
                                                                     packed_weights, monkeypatch):
    import vidsight.models.packed_linear as packing
    from vidsight.api.serve import ServeConfig
    from vidsight.api.serve.state import Server

    monkeypatch.setattr(packing, "MIN_PACKED_ELEMENTS", 0)   # the tiny model's layers are all small

    config = ServeConfig(model=str(tiny_model_dir), device="cpu", db=tmp_path / "serve.db",
                         packed_weights=packed_weights)
    for server in (Server(config), Server(config, adapter=tiny_adapter)):
        server.start()
        try:
            packed = any(isinstance(m, PackedLinear) for m in server.adapter.model.modules())
            assert packed == (packed_weights and server.adapter is not tiny_adapter)
        finally:
            server.stop()


def test_the_server_packs_by_default_and_plain_weights_turns_it_off():
    from vidsight.api.cli import build_parser
    from vidsight.api.serve_cli import serve_config

    parse = build_parser().parse_args
    assert serve_config(parse(["serve", "--model", "tiny"])).packed_weights
    assert not serve_config(parse(["serve", "--model", "tiny", "--plain-weights"])).packed_weights
