"""A tiny model shape the benchmarks can be run with: they must not care which weights they time."""

import pytest


@pytest.fixture
def tiny_shape(monkeypatch):
    """Registers the tiny model's sizes as the shape ``tiny-test`` for the test; returns the name."""
    import vidsight.models.shapes as shapes

    monkeypatch.setitem(shapes.MODEL_SHAPES, "tiny-test", shapes.Shape(
        text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}),
        vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
                    spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
                    tokens_per_second=2),
        min_pixels=56 * 56, max_pixels=112 * 112, total_pixels=112 * 112 * 256))
    return "tiny-test"
