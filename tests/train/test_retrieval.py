"""The training-only retrieval loss against its definition, and the patches it points at."""

import numpy as np
import torch

from vidsight.tasks.chat import make_chat_stream
from vidsight.tasks.families import SAMPLE_FPS
from vidsight.train.batches import make_batch
from vidsight.train.loop import build_adapter
from vidsight.train.retrieval import ProjectionTap, asked_patches, retrieval_loss


def test_asked_patches_are_those_showing_the_object_a_chat_question_names():
    stream = make_chat_stream(7, 128)
    for question in stream.questions:
        sample = stream.sample(question)
        shown = asked_patches(sample, 2)
        named = [o for o in stream.scene.objects if o.shape in question.question or f"the {o.colour} " in question.question]
        assert len(named) == (2 if question.family == "order" else 1)
        expected = np.zeros(-(-sample.frames // 2), dtype=bool)
        for obj in named:
            for frame in range(sample.frames):
                if obj.t_in <= frame / SAMPLE_FPS < obj.t_out:
                    expected[frame // 2] = True
        assert shown.any() and np.array_equal(shown, expected)


class Tap:
    def __init__(self, queries, keys):
        self.queries, self.keys = queries, keys


def test_retrieval_loss_is_the_cross_entropy_of_reKVs_patch_scores():
    generator = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, patches, per_patch = 4, 2, 8, 5, 3
    length = 2 + patches * per_patch + 4
    queries = [torch.randn(1, length, heads * dim, generator=generator) for _ in range(2)]
    keys = [torch.randn(1, length, kv_heads * dim, generator=generator) for _ in range(2)]
    video = torch.tensor([[2, 2 + patches * per_patch, patches]])
    question = torch.tensor([[2 + patches * per_patch, length]])
    wanted = torch.tensor([[False, True, False, True, False]])
    loss = retrieval_loss(Tap(queries, keys), video, question, wanted, heads, kv_heads)
    expected = []
    for q, k in zip(queries, keys):
        block_means = k[0, 2 : 2 + patches * per_patch].reshape(patches, per_patch, -1).mean(dim=1)
        mean_query = q[0, question[0, 0] :].mean(dim=0).reshape(kv_heads, heads // kv_heads, dim).sum(dim=1)
        scores = block_means @ mean_query.reshape(-1)
        expected.append(-torch.log(torch.softmax(scores, 0)[wanted[0]].sum()))
    assert torch.allclose(loss, torch.stack(expected).mean(), atol=1e-5)
    assert retrieval_loss(Tap(queries, keys), video, question, torch.zeros_like(wanted), heads, kv_heads) is None


def test_the_tap_sees_each_layers_projections_before_the_rotary_embedding():
    adapter = build_adapter(seed=0)
    stream = make_chat_stream(3, 64)
    batch = make_batch([stream.sample(stream.questions[0])], adapter, augment=False)
    question = stream.questions[0]
    assert batch.asked_patches[0].any() and int(batch.video_span[0, 2]) == -(-question.frames_seen // 2)
    layers = adapter.model.model.language_model.layers
    tap = ProjectionTap(layers)
    try:
        with torch.no_grad():
            adapter.model(input_ids=batch.input_ids, position_ids=batch.position_ids,
                          pixel_values_videos=batch.pixel_values, video_grid_thw=batch.grid_thw)
    finally:
        tap.close()
    assert len(tap.queries) == len(tap.keys) == len(layers)
    assert not layers[0].self_attn.q_proj._forward_hooks   # closed
    hidden = adapter.model.model.language_model.embed_tokens(batch.input_ids[:, :3])
    normed = layers[0].input_layernorm(hidden)
    assert torch.allclose(tap.keys[0][:, :3], layers[0].self_attn.k_proj(normed), atol=1e-5)
