import math

import numpy as np
import pytest
import torch

from vidsight.tasks.families import key_word, make_sample
from vidsight.models import load_model
from vidsight.models.positions import prompt_positions
from vidsight.errors import ConfigError
from vidsight.train import TrainConfig, export_checkpoint, train
from vidsight.train.batches import IGNORE, make_batch, yuv420_roundtrip
from vidsight.train.loop import build_adapter, step_samples


def test_batch_labels_only_the_answer_and_uses_vidsight_positions():
    adapter = build_adapter(seed=0)
    samples = [make_sample("attribute", 3), make_sample("attribute", 4)]
    batch = make_batch(samples, adapter, augment=False)
    for row, sample in enumerate(samples):
        start = int(batch.answer_start[row])
        labelled = batch.labels[row] != IGNORE
        assert labelled.nonzero().flatten().tolist() == [start, start + 1]
        answer = adapter.tokenizer.decode(batch.input_ids[row, start : start + 1])
        assert answer == sample.answer.lower()
        video = (batch.input_ids[row] == adapter.video_token_id).nonzero().flatten()
        vpos = adapter.video_positions(tuple(batch.grid_thw[row].tolist()), 1.0, int(video[0]))
        expected, _ = prompt_positions(start + 2, int(video[0]), vpos)
        assert torch.equal(batch.position_ids[:, row, : start + 2], expected)


def test_key_word_is_the_shape_or_colour_asked_about():
    assert key_word("What colour is the square?") == "square"
    assert key_word("What colour was the triangle?") == "triangle"
    assert key_word("What shape is the red object?") == "red"
    assert key_word("Which appeared first, the circle or the square?") == "square"
    assert key_word("How many objects are there?") is None


def test_key_word_targets_sit_on_the_key_word_and_name_the_answer():
    adapter = build_adapter(seed=0)
    tokenizer = adapter.tokenizer
    samples = [make_sample("attribute", seed) for seed in range(4)] + [make_sample("count", 0), make_sample("order", 1)]
    for sample in samples:
        batch = make_batch([sample], adapter, augment=False, probes=3)
        ids, targets, labels = batch.input_ids[0], batch.key_targets[0], batch.labels[0]
        start = int(batch.answer_start[0])
        first_turn = (targets[:start] != IGNORE).nonzero().flatten().tolist()
        word = key_word(sample.question)
        assert len(first_turn) == (word is not None)
        if word is not None:
            assert tokenizer.convert_ids_to_tokens(int(ids[first_turn[0]])) == word
        # Every target, first turn or later, is the first answer token after it.
        answers = (labels != IGNORE).nonzero().flatten()
        for at in (targets != IGNORE).nonzero().flatten():
            assert int(targets[at]) == int(ids[answers[answers > at][0]])


def test_yuv420_roundtrip_keeps_flat_colours_and_blurs_chroma_edges():
    frames = np.zeros((1, 4, 4, 3), dtype=np.uint8)
    frames[..., 0] = 200
    np.testing.assert_allclose(yuv420_roundtrip(frames).astype(int), frames.astype(int), atol=1)
    frames[0, :, 1] = (0, 0, 255)  # a one-pixel blue column shares chroma with its red neighbour
    assert (yuv420_roundtrip(frames)[0, :, 1].astype(int) != (0, 0, 255)).any()


def test_training_is_reproducible_resumable_and_exports_a_loadable_model(tmp_path):
    config = TrainConfig(steps=4, eval_every=2, eval_per_family=2, batch=2)
    one = train(tmp_path / "one", config, progress=False)
    # Same seed from scratch, and stopping at step 2 then resuming, give the same weights.
    two = train(tmp_path / "two", TrainConfig(**{**config.__dict__, "steps": 2}), progress=False)
    two = train(tmp_path / "two", config, resume=True, progress=False)
    first, second = load_model(one, device="cpu"), load_model(two, device="cpu")
    for (name, a), (_, b) in zip(first.model.state_dict().items(), second.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert (tmp_path / "one" / "curves.png").is_file()
    log = (tmp_path / "one" / "log.jsonl").read_text().splitlines()
    assert len(log) == 2


def test_step_samples_depend_on_seed_and_step_only():
    config = TrainConfig()
    a, b = step_samples(config, 17), step_samples(config, 17)
    assert [s.seed for s in a] == [s.seed for s in b] and a[0].family == b[0].family
    assert [s.seed for s in step_samples(TrainConfig(seed=1), 17)] != [s.seed for s in a]


def test_an_offset_clip_has_the_same_tokens_with_later_temporal_positions():
    adapter = build_adapter(seed=0)
    sample = make_sample("needle", 5, 16)
    later = make_sample("needle", 5, 16)
    later.offset_patches = 100
    a, b = make_batch([sample], adapter, augment=False), make_batch([later], adapter, augment=False)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.pixel_values, b.pixel_values)
    video = (a.input_ids[0] == adapter.video_token_id).nonzero().flatten()
    shift = b.position_ids[:, 0] - a.position_ids[:, 0]
    assert (shift[:, : video[0]] == 0).all()                            # the system prompt stays
    assert (shift[0, video] == 200).all() and (shift[1:, video] == 0).all()  # 100 patches of 2 ticks, time only
    assert (shift[:, video[-1] + 1 :] == 200).all()                     # the question follows the video


def test_chat_steps_alternate_and_are_chat_suite_prefixes():
    config = TrainConfig(chat_frames=(128,), offset_patches=50)
    families = [step_samples(config, step)[0].family for step in range(4)]
    assert families[0] == "count" and families[1].startswith("chat-") and families[3].startswith("chat-")
    chat = step_samples(config, 1)
    assert len(chat) == 2 and all(s.frames <= 128 and s.frames % 2 == 0 for s in chat)
    offsets = [s.offset_patches for step in range(40) for s in step_samples(config, step)]
    assert 0 in offsets and max(offsets) <= 50 and len(set(offsets)) > 5


def test_a_fine_tune_starts_from_its_checkpoint_and_keeps_its_record(tmp_path):
    import json

    base = train(tmp_path / "base", TrainConfig(steps=2, eval_every=2, eval_per_family=1, batch=2, layers=2),
                 progress=False)
    # Two steps: the second is a chat step, with both training-only chat losses.
    tuned = train(tmp_path / "tuned", TrainConfig(steps=2, eval_every=2, eval_per_family=1, batch=2, init=str(base),
                                                   chat_frames=(64,), offset_patches=8, mrope_section=(8, 4, 4),
                                                   rope_theta=1e6, retrieval_weight=1.0, attention_weight=1.0),
                  progress=False)
    record = json.loads((tuned / "vidsight_training.json").read_text())
    assert record["base"]["steps_trained"] == 2 and record["config"]["init"] == str(base)
    assert record["config"]["attention_weight"] == 1.0
    last = json.loads((tmp_path / "tuned" / "log.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 2 and math.isfinite(last["loss"])
    assert "chat" in record["held_out_accuracy"]
    # The fine-tune's rotary embedding is the one asked for and its depth its base's, in the checkpoint
    # and in its re-export.
    for directory in (tuned, export_checkpoint(tmp_path / "tuned")):
        text = load_model(directory, device="cpu").model.config.text_config
        assert text.rope_parameters["mrope_section"] == [8, 4, 4] and text.rope_parameters["rope_theta"] == 1e6
        assert text.num_hidden_layers == 2
    with pytest.raises(ConfigError, match="mrope_section"):
        TrainConfig(mrope_section=(4, 4, 4))
    start = build_adapter(0, str(base)).model.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(start.values(), load_model(base, device="cpu").model.state_dict().values()))


def test_a_checkpoint_grown_deeper_computes_what_it_did_until_training_moves_its_new_layers():
    from vidsight.train.loop import model_loss

    shipped = "vidsight/assets/tasks-qwen2.5-vl"
    text = load_model(shipped, device="cpu").model.config.text_config
    settings = dict(mrope_section=tuple(text.rope_parameters["mrope_section"]),
                    rope_theta=text.rope_parameters["rope_theta"])
    depth = text.num_hidden_layers
    base = build_adapter(0, shipped, TrainConfig(**settings))   # the checkpoint's own depth
    assert len(base.model.model.language_model.layers) == depth
    grown = build_adapter(1, shipped, TrainConfig(**settings, layers=depth + 2))
    assert len(grown.model.model.language_model.layers) == depth + 2
    batch = make_batch([make_sample("attribute", 3), make_sample("order", 1)], base, augment=False)

    def logits(adapter):
        with torch.no_grad():
            return adapter.model.eval()(input_ids=batch.input_ids, position_ids=batch.position_ids,
                                        pixel_values_videos=batch.pixel_values, video_grid_thw=batch.grid_thw).logits

    torch.testing.assert_close(logits(grown), logits(base), rtol=0, atol=1e-5)
    loss = model_loss(grown.model.train(), batch)
    loss.backward()
    added = grown.model.model.language_model.layers[depth]
    assert added.self_attn.o_proj.weight.grad.abs().max() > 0 and added.mlp.down_proj.weight.grad.abs().max() > 0
    assert added.self_attn.q_proj.weight.abs().max() > 0   # only the outputs start at zero
    with pytest.raises(ConfigError, match=f"{depth} layers, more than the 2"):
        build_adapter(0, shipped, TrainConfig(**settings, layers=2))
    with pytest.raises(ConfigError, match="layers"):
        TrainConfig(layers=0)


def test_order_targets_name_the_shapes_seen_before_each_object():
    from vidsight.tasks.scenes import OBJECT_SHAPES

    adapter = build_adapter(seed=0)
    spec = adapter.vision
    order, count = make_sample("order", 3), make_sample("count", 0)
    batch = make_batch([order, count], adapter, augment=False)
    targets = batch.order_targets
    assert (targets[1] == IGNORE).all()  # objects there all appear at once: no order to learn
    video = batch.input_ids[0] == adapter.video_token_id
    assert (targets[0][~video] == IGNORE).all()
    cells = torch.from_numpy(order.cell_labels(spec.patch_size * spec.merge_size, spec.temporal_patch_size))
    earlier = targets[0][video]
    assert torch.equal(earlier != IGNORE, cells.reshape(-1) > 0)  # exactly the tokens an object covers
    first, second = sorted(order.scene.objects, key=lambda obj: obj.t_in)
    # The first object's tokens saw nothing before it; the second's saw the first's shape.
    shape_of_cell = (cells.reshape(-1) - 1) % len(OBJECT_SHAPES)
    for shape, expected in ((first.shape, 0), (second.shape, 1 << OBJECT_SHAPES.index(first.shape))):
        mine = (cells.reshape(-1) > 0) & (shape_of_cell == OBJECT_SHAPES.index(shape))
        assert mine.any() and (earlier[mine] == expected).all()


def test_an_earlier_shape_counts_once_however_often_it_appeared():
    from vidsight.tasks.families import FRAME, Sample
    from vidsight.tasks.scenes import OBJECT_SHAPES, Scene, SceneObject

    scene = Scene(FRAME, FRAME, 8.0, 0)
    for t_in, shape, place in ((0.0, "circle", (2.0, 2.0)), (2.0, "circle", (60.0, 2.0)), (4.0, "square", (2.0, 60.0))):
        scene.objects.append(SceneObject(shape, "red", 28, t_in, 9.0, place))
    sample = Sample("order", 0, scene, "", "", 16)
    assert sample.appearances_distinct
    earlier = sample.cell_earlier(28, 2)
    assert set(np.unique(earlier).tolist()) == {-1, 0, 1 << OBJECT_SHAPES.index("circle")}
