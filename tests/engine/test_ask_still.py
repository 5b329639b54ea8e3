"""A still image asked about as transformers' Qwen image processors and models take one."""

import numpy as np
import pytest
import torch

from vidsight.engine import Asker, GenerationConfig
from vidsight.errors import ConfigError
from vidsight.ingest import decode_frames
from vidsight.models.conversation import IMAGE_PART, VIDEO_PART, Conversation, Message
from vidsight.vision import preprocess_video

from tests.settings import assert_logits_close, assert_same_greedy_ids, on_device

QUESTION = "What colour is the square?"
NEW_TOKENS = 12
# Text before and after the picture, and an earlier turn, as a chat client sends them.
CONVERSATION = Conversation((Message("system", ("Answer in one word.",)),
                             Message("user", ("Look:", IMAGE_PART, QUESTION)), Message("assistant", ("Red.",)),
                             Message("user", ("And the background?",))))


def image_processor(adapter):
    """The checkpoint's own image processor (PIL's resize where torchvision is missing, torch's where not)."""
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(adapter.model.name_or_path)


def reference_inputs(adapter, path, conversation):
    """transformers' inputs for the picture: the image processor's grid, the template's image
    mark repeated once per token (as the processor writes it), and the pixels `ask` encodes."""
    frame = decode_frames(path, np.zeros(1, dtype=np.int64)).data
    theirs = image_processor(adapter)(images=[frame[0].numpy()], return_tensors="pt")
    grid = tuple(theirs["image_grid_thw"][0].tolist())
    ours = preprocess_video(frame, adapter.still_vision, size=(grid[1] * adapter.still_vision.patch_size,
                                                                grid[2] * adapter.still_vision.patch_size))
    assert ours.grid_thw == grid   # the same resize, by the image processor's bounds
    # The processor's bicubic (PIL's, or torch's in float) against vidsight's: within an intensity level or two.
    step = 1 / 255 / min(adapter.still_vision.image_std)
    assert (ours.pixel_values - theirs["pixel_values"]).abs().max() <= 2.01 * step
    text = adapter.tokenizer.apply_chat_template(conversation.template_form(), chat_template=adapter.chat_template,
                                                 add_generation_prompt=True, tokenize=False)
    pad = adapter.tokenizer.convert_ids_to_tokens(adapter.image_token_id)
    text = text.replace(pad, pad * (grid[0] * grid[1] * grid[2] // adapter.still_vision.merge_size ** 2))
    ids = torch.tensor([adapter.tokenizer(text, add_special_tokens=False)["input_ids"]])
    return on_device(dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=ours.pixel_values,
                          image_grid_thw=torch.tensor([grid]), mm_token_type_ids=(ids == adapter.image_token_id).int()))


@pytest.fixture(params=["tiny_adapter", "qwen3_adapter"])
def qwen_adapter(request):
    return request.getfixturevalue(request.param)


@pytest.mark.device_check
@pytest.mark.parametrize("conversation", [Conversation.of(QUESTION, visual=IMAGE_PART), CONVERSATION],
                         ids=["question", "conversation"])
def test_a_still_is_answered_as_transformers_generate_answers_the_image(qwen_adapter, picture, conversation):
    """Greedy ids equal transformers' `generate` given the picture as an image (its image
    processor's size, the template's image mark, no timestamp), and first-token logits its forward's."""
    asker = Asker(qwen_adapter)
    result = asker.ask(picture, conversation, generation=GenerationConfig(max_new_tokens=NEW_TOKENS))
    inputs = reference_inputs(qwen_adapter, picture, conversation)
    assert result.stats.frames == 1
    assert result.stats.prompt_tokens == inputs["input_ids"].shape[1]
    assert result.stats.visual_tokens == int((inputs["input_ids"] == qwen_adapter.image_token_id).sum())
    out = qwen_adapter.model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                                      return_dict_in_generate=True)
    assert_same_greedy_ids(result.token_ids, out.sequences[0, inputs["input_ids"].shape[1]:].tolist(), out.logits)
    assert_logits_close(asker.prefill_logits(picture, conversation), out.logits[0][0])


def test_a_qwen3_still_has_no_timestamp(qwen3_adapter, picture):
    """Qwen3-VL writes a video patch's time before it, and nothing before a picture: the still's
    prompt is the one-frame video's without ``<0.0 seconds>`` and its marks."""
    from vidsight.engine.prompt import build_video_prompt, plan_visual

    def prompt(visual):
        conversation = Conversation.of(QUESTION, visual=visual)
        plan = plan_visual(qwen3_adapter, conversation, 1, 144, 176)
        return build_video_prompt(qwen3_adapter, conversation, plan, torch.zeros(1), torch.zeros(1), 1.0).ids

    still, video = (qwen3_adapter.tokenizer.decode(prompt(visual)) for visual in (IMAGE_PART, VIDEO_PART))
    assert "<0.0 seconds><|vision_start|><|video_pad|>" in video
    assert "seconds" not in still and "<|vision_start|><|image_pad|>" in still
    assert still.replace("image_pad", "video_pad") == video.replace("<0.0 seconds>", "")


@pytest.mark.device_check
def test_internvl_cuts_a_picture_into_its_processors_tiles_and_answers_as_transformers(internvl_adapter, picture):
    """InternVL's processor (crop_to_patches, as its -hf processor asks): the same grid of tiles
    and thumbnail, pixels within two levels, and the answer transformers' `generate` gives with
    ``<img>`` + every tile's tokens + ``</img>`` where the template writes ``<IMG_CONTEXT>``."""
    from vidsight.vision.tiles import tile_picture

    adapter, conversation = internvl_adapter, Conversation.of(QUESTION, visual=IMAGE_PART)
    frame = decode_frames(picture, np.zeros(1, dtype=np.int64)).data[0]
    theirs = image_processor(adapter)(images=[frame.numpy()], crop_to_patches=True, return_tensors="pt")
    ours = preprocess_video(tile_picture(frame, adapter.still_vision), adapter.still_vision).pixel_values
    assert ours.shape == theirs["pixel_values"].shape and int(theirs["num_patches"][0]) == len(ours) == 13
    assert (ours - theirs["pixel_values"]).abs().max() <= 2.01 / 255 / min(adapter.still_vision.image_std)
    vision = adapter.model.config.vision_config
    per_tile = int((vision.image_size[0] // vision.patch_size[0]) ** 2 * adapter.model.config.downsample_ratio ** 2)
    text = adapter.tokenizer.apply_chat_template(conversation.template_form(), chat_template=adapter.chat_template,
                                                 add_generation_prompt=True, tokenize=False)
    assert text.count("<IMG_CONTEXT>") == 1
    text = text.replace("<IMG_CONTEXT>", "<img>" + "<IMG_CONTEXT>" * per_tile * len(ours) + "</img>")
    ids = torch.tensor([adapter.tokenizer(text, add_special_tokens=False)["input_ids"]])
    inputs = on_device(dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=ours))
    result = Asker(adapter).ask(picture, conversation, generation=GenerationConfig(max_new_tokens=NEW_TOKENS))
    assert (result.stats.frames, result.stats.prompt_tokens) == (13, ids.shape[1])
    out = adapter.model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)
    assert_same_greedy_ids(result.token_ids, out.sequences[0, ids.shape[1]:].tolist(), out.logits)
    assert_logits_close(Asker(adapter).prefill_logits(picture, conversation), out.logits[0][0])


def test_the_tile_grid_is_the_processors_for_any_shape():
    """Every picture shape from a sliver to a panorama, small and large: the grid transformers'
    GotOcr2 processor picks, ties included."""
    try:   # the processor's PIL module where torchvision is missing, its torchvision one where not
        from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import get_optimal_tiled_canvas
    except ImportError:
        from transformers.models.got_ocr2.image_processing_got_ocr2 import get_optimal_tiled_canvas

    from vidsight.vision.tiles import tile_grid

    sides = [1, 37, 84, 100, 150, 200, 224, 300, 448, 640, 896, 1000, 1344, 1920, 4032]
    for height in sides:
        for width in sides:
            for fewest, most in ((1, 12), (1, 6), (2, 9)):
                assert tile_grid(height, width, (448, 448), fewest, most) == get_optimal_tiled_canvas(
                    (height, width), (448, 448), fewest, most), (height, width, fewest, most)


def test_llava_onevision_which_tiles_pictures_otherwise_refuses_a_still_and_names_the_model(picture, llava_adapter):
    assert llava_adapter.still_vision is None
    with pytest.raises(ConfigError, match="still image"):
        Asker(llava_adapter).ask(picture, Conversation.of(QUESTION, visual=IMAGE_PART))


def test_a_conversation_holds_one_video_or_image():
    with pytest.raises(ConfigError, match="at most one video or image"):
        Conversation((Message("user", (IMAGE_PART, VIDEO_PART, QUESTION)),))
    with pytest.raises(ConfigError, match="image must be in a user message"):
        Conversation((Message("system", (IMAGE_PART,)), Message("user", (QUESTION,))))
    form = CONVERSATION.template_form()[1]["content"]
    assert form == [{"type": "text", "text": "Look:"}, {"type": "image"}, {"type": "text", "text": QUESTION}]
    assert CONVERSATION.still and CONVERSATION.visual is IMAGE_PART


def test_the_still_bounds_are_the_checkpoints_image_processors(tmp_path, picture):
    """A checkpoint whose image processor bounds differ from its video processor's: a still is
    resized within the image ones (`smart_resize`); transformers' defaults where it names none."""
    import json

    from vidsight.models import load_model, write_tiny_model
    from vidsight.models.base import IMAGE_MAX_PIXELS, IMAGE_MIN_PIXELS
    from vidsight.vision.preprocess import smart_resize

    directory = write_tiny_model(tmp_path / "m")
    settings = json.loads((directory / "preprocessor_config.json").read_text())
    settings.update(min_pixels=28 * 28, max_pixels=84 * 84)
    settings.pop("size", None)
    (directory / "preprocessor_config.json").write_text(json.dumps(settings))
    adapter = load_model(directory, "cpu")
    assert (adapter.still_vision.min_pixels, adapter.still_vision.max_pixels) == (28 * 28, 84 * 84)
    assert adapter.vision.max_pixels != 84 * 84
    assert image_processor(adapter)(images=[np.zeros((150, 200, 3), np.uint8)])["image_grid_thw"].tolist() == [
        [1, *(side // 14 for side in smart_resize(150, 200, 28, 28 * 28, 84 * 84))]]
    result = Asker(adapter).ask(picture, Conversation.of(QUESTION, visual=IMAGE_PART),
                                generation=GenerationConfig(max_new_tokens=1))
    height, width = smart_resize(150, 200, 28, 28 * 28, 84 * 84)
    assert result.stats.visual_tokens == height * width // 28 ** 2
    default = adapter.vision.still({})
    assert (default.min_pixels, default.max_pixels) == (IMAGE_MIN_PIXELS, IMAGE_MAX_PIXELS)


def test_a_second_question_about_a_picture_continues_its_prefix_and_the_video_does_not(tiny_adapter, picture):
    """The prefix cache keeps a picture's prefix for the next question about it (answered as
    alone), and the same file asked about as a video is another prefix."""
    from vidsight.engine.prefix_cache import PrefixCache

    generation = GenerationConfig(max_new_tokens=6)
    cached = Asker(tiny_adapter, prefix_cache=PrefixCache(1 << 30))
    questions = [Conversation.of(text, visual=IMAGE_PART) for text in (QUESTION, "Where is the square?")]
    first, second = (cached.ask(picture, question, generation=generation) for question in questions)
    assert first.stats.cached_tokens == 0 < second.stats.cached_tokens
    assert second.token_ids == Asker(tiny_adapter).ask(picture, questions[1], generation=generation).token_ids
    video = cached.ask(picture, Conversation.of(QUESTION, visual=VIDEO_PART), generation=generation)
    assert video.stats.cached_tokens == 0
