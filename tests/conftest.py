"""Shared fixtures: a tiny random-weight checkpoint and synthetic videos, made once per run."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
import torch

from vidsight.ingest import SyntheticSpec, make_video
from vidsight.models import load_model, write_tiny_model

from tests.settings import DEVICE, DTYPE


# Benchmarks, the command line end to end and training: `-m "not slow"` leaves them out.
SLOW_FOLDERS = ("bench", "api", "train")
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.path.relative_to(TESTS).parts[0] in SLOW_FOLDERS:   # tests/api/serve too
            item.add_marker(pytest.mark.slow)
        if "needs_cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen2.5-vl", seed=0)


@pytest.fixture(scope="session")
def tiny_adapter(tiny_model_dir):
    return load_model(tiny_model_dir, DEVICE, DTYPE)


@pytest.fixture(scope="session")
def packed_tiny_adapter(tiny_model_dir):
    """The tiny model with its linear weights in oneDNN's blocked layout, as a CPU server runs a
    real model's large ones (`models.packed_linear`; left plain where it cannot be packed: CUDA, bfloat16)."""
    from vidsight.models.packed_linear import pack_linear_weights

    adapter = load_model(tiny_model_dir, DEVICE, DTYPE)
    pack_linear_weights(adapter.model, min_elements=0)   # every layer, however small
    return adapter


@pytest.fixture(scope="session")
def llava_adapter(tmp_path_factory):
    directory = tmp_path_factory.mktemp("models") / "tiny-llava-onevision"
    return load_model(write_tiny_model(directory, seed=0, family="llava_onevision"), DEVICE, DTYPE)


@pytest.fixture(scope="session")
def internvl_adapter(tmp_path_factory):
    directory = tmp_path_factory.mktemp("models") / "tiny-internvl"
    return load_model(write_tiny_model(directory, seed=0, family="internvl"), DEVICE, DTYPE)


@pytest.fixture(scope="session")
def qwen3_adapter(tmp_path_factory):
    directory = tmp_path_factory.mktemp("models") / "tiny-qwen3-vl"
    return load_model(write_tiny_model(directory, seed=0, family="qwen3_vl"), DEVICE, DTYPE)


# Where the tiny template's generation prompt ends, and Qwen3-VL-Thinking's: it opens the thinking,
# or, with Qwen3's ``enable_thinking`` false, holds an empty one closed.
GENERATION_PROMPT = "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
THINKING_PROMPT = ("{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
                   "enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}")


@pytest.fixture(scope="session")
def thinking_adapter(tmp_path_factory):
    """The tiny Qwen3-VL as a thinking checkpoint: ``<think>`` and ``</think>`` in its vocabulary
    (added tokens, not special ones, as in Qwen3's) and Qwen3-VL-Thinking's generation prompt."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    directory = write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3-vl-thinking", seed=0,
                                 family="qwen3_vl")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.add_tokens(["<think>", "</think>"])
    assert GENERATION_PROMPT in tokenizer.chat_template
    tokenizer.chat_template = tokenizer.chat_template.replace(GENERATION_PROMPT, THINKING_PROMPT)
    model = AutoModelForImageTextToText.from_pretrained(directory)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return load_model(directory, DEVICE, DTYPE)


@pytest.fixture(params=["tiny_adapter", "qwen3_adapter", "llava_adapter", "internvl_adapter"])
def family_adapter(request):
    """The tiny model of each family, in turn."""
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="session")
def picture(tmp_path_factory):
    """A 200x150 PNG: a red square on a blue-green gradient (its size and aspect ratio not a grid's)."""
    rgb = np.zeros((150, 200, 3), dtype=np.uint8)
    rgb[..., 2] = np.linspace(60, 200, 200, dtype=np.uint8)[None]
    rgb[..., 1] = np.linspace(40, 120, 150, dtype=np.uint8)[:, None]
    rgb[40:90, 70:130] = (220, 30, 30)
    path = tmp_path_factory.mktemp("still") / "square.png"
    av.VideoFrame.from_ndarray(rgb, format="rgb24").to_image().save(path)
    return path


@pytest.fixture(scope="session")
def make_test_video(tmp_path_factory):
    """``make_test_video(suffix=".mp4", **spec_fields) -> (path, truth)``, cached per spec and container."""
    root = tmp_path_factory.mktemp("videos")
    cache: dict[tuple[SyntheticSpec, str], tuple] = {}

    def make(suffix=".mp4", **fields):
        key = (SyntheticSpec(**fields), suffix)
        if key not in cache:
            path = root / f"video{len(cache)}{suffix}"
            cache[key] = (path, make_video(path, key[0]))
        return cache[key]

    return make
