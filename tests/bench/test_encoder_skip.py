"""Skipping merge groups inside a full-attention tower (InternViT, Qwen3-VL's ViT): measured against
the full encoding on a model shape."""

import pytest

from vidsight.bench.encoder_skip import run_encoder_skip


@pytest.mark.parametrize("family", ["internvl", "qwen3_vl"])
def test_the_kept_tokens_are_compared_with_the_full_encoding(tmp_path, monkeypatch, family):
    import vidsight.models.shapes as shapes
    from vidsight.models.tiny import (TINY_INTERNVIT, TINY_QWEN2_TEXT, TINY_QWEN3_PIXELS, TINY_QWEN3_TEXT,
                                      TINY_QWEN3_VISION)

    shape = (shapes.Shape(family="internvl", text=dict(TINY_QWEN2_TEXT, vocab_size=512), vision=TINY_INTERNVIT)
             if family == "internvl" else
             shapes.Shape(family="qwen3_vl", text=dict(TINY_QWEN3_TEXT, vocab_size=512), vision=TINY_QWEN3_VISION,
                          **TINY_QWEN3_PIXELS))
    monkeypatch.setitem(shapes.MODEL_SHAPES, "tiny", shape)
    report = run_encoder_skip("tiny", shares=(1.0, 0.5), frames=4, out=str(tmp_path / "skip"))
    every, half = report["shares"][1.0], report["shares"][0.5]
    assert every["kept"] == report["temporal_patches"] * report["tokens_per_patch"]
    assert every["relative_error_mean"] == 0
    assert 0 < half["kept"] < every["kept"]
    assert half["relative_error_mean"] > 0 and -1 <= half["cosine_min"] <= half["cosine_mean"] <= 1 + 1e-6
