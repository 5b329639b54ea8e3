"""The training-only attention loss against the model's own attention weights."""

import torch

from vidsight.tasks.chat import make_chat_stream
from vidsight.train.attention import RotaryTap, attention_loss, key_word_rows
from vidsight.train.batches import IGNORE, make_batch
from vidsight.train.loop import KEY_LAYER, build_adapter
from vidsight.train.retrieval import ProjectionTap


def test_attention_loss_is_the_best_early_heads_share_of_video_attention_on_the_asked_patches():
    adapter = build_adapter(seed=0)
    model = adapter.model
    model.set_attn_implementation("eager")   # so the reference weights can be returned
    stream = make_chat_stream(3, 64)
    batch = make_batch([stream.sample(q) for q in stream.questions[:1]], adapter, augment=False)
    layers = model.model.language_model.layers
    projections, rotary = ProjectionTap(layers), RotaryTap(layers)
    try:
        with torch.no_grad():
            out = model(input_ids=batch.input_ids, position_ids=batch.position_ids, output_attentions=True,
                        pixel_values_videos=batch.pixel_values, video_grid_thw=batch.grid_thw)
    finally:
        projections.close()
        rotary.close()
    rows = key_word_rows(batch.key_targets, batch.question_span, IGNORE)
    assert int(rows.sum()) == 1
    text = model.config.text_config
    loss = attention_loss(projections, rotary, KEY_LAYER, batch.video_span, rows, batch.asked_patches,
                          text.num_attention_heads, text.num_key_value_heads)
    (v0, v1, patches), row = batch.video_span[0].tolist(), int(torch.nonzero(rows[0])[0])
    asked = batch.asked_patches[0, :patches].repeat_interleave((v1 - v0) // patches)
    shares = [(a[0, :, row, v0:v1] * asked).sum(-1) / a[0, :, row, v0:v1].sum(-1) for a in out.attentions[:KEY_LAYER]]
    assert asked.any() and not asked.all()
    assert torch.allclose(loss, -torch.log(torch.cat(shares).max()), atol=1e-5)
    none = attention_loss(projections, rotary, KEY_LAYER, batch.video_span, rows, torch.zeros_like(batch.asked_patches),
                          text.num_attention_heads, text.num_key_value_heads)
    assert none is None
