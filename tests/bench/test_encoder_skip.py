"""Skipping merge groups inside InternViT: measured against the full encoding on a model shape."""

from vidsight.bench.encoder_skip import run_encoder_skip


def test_the_kept_tokens_are_compared_with_the_full_encoding(tmp_path, monkeypatch):
    import vidsight.models.shapes as shapes
    from vidsight.models.tiny import TINY_INTERNVIT, TINY_QWEN2_TEXT

    monkeypatch.setitem(shapes.MODEL_SHAPES, "tiny-internvl", shapes.Shape(
        family="internvl", text=dict(TINY_QWEN2_TEXT, vocab_size=512), vision=TINY_INTERNVIT))
    report = run_encoder_skip("tiny-internvl", shares=(1.0, 0.5), frames=2, out=str(tmp_path / "skip"))
    every, half = report["shares"][1.0], report["shares"][0.5]
    assert every["kept"] == 2 * report["tokens_per_frame"] and every["relative_error_mean"] == 0
    assert 0 < half["kept"] < every["kept"]
    assert half["relative_error_mean"] > 0 and -1 <= half["cosine_min"] <= half["cosine_mean"] <= 1 + 1e-6
