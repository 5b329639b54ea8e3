import json

import pytest
import torch
from safetensors.torch import load_file

from vidsight.errors import ModelError
from vidsight.models import load_model, write_tiny_model


def test_tiny_checkpoint_loads_like_a_real_one(tiny_model_dir, tiny_adapter):
    for name in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "preprocessor_config.json", "video_preprocessor_config.json", "generation_config.json"]:
        assert (tiny_model_dir / name).is_file(), name
    assert json.loads((tiny_model_dir / "config.json").read_text())["model_type"] == "qwen2_5_vl"
    assert tiny_adapter.family == "qwen2_5_vl"
    assert tiny_adapter.vision.max_pixels == 224 * 224
    im_end = tiny_adapter.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in tiny_adapter.eos_token_ids


def test_same_seed_same_weights_other_seed_other_weights(tmp_path, tiny_model_dir):
    again = load_file(write_tiny_model(tmp_path / "again", seed=0) / "model.safetensors")
    other = load_file(write_tiny_model(tmp_path / "other", seed=1) / "model.safetensors")
    first = load_file(tiny_model_dir / "model.safetensors")
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_prompt_has_chat_format_and_expanded_video(tiny_adapter):
    layout = tiny_adapter.build_prompt("How many squares?", video_tokens=7)
    text = tiny_adapter.tokenizer.decode(layout.input_ids)
    assert text.startswith("<|im_start|>system\n")
    assert "<|vision_start|>" + "<|video_pad|>" * 7 + "<|vision_end|>How many squares?<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert (layout.input_ids == tiny_adapter.video_token_id).sum() == 7
    assert layout.input_ids[layout.video_start] == tiny_adapter.video_token_id


def test_missing_model_directory(tmp_path):
    with pytest.raises(ModelError, match="no such model directory"):
        load_model(tmp_path / "nowhere")


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        load_model(tmp_path)


def test_unsupported_family(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ModelError, match="not supported.*qwen2_5_vl, qwen3_vl, llava_onevision, internvl"):
        load_model(tmp_path)


def test_garbage_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="cannot load model config"):
        load_model(tmp_path)
