import pytest
import torch

from vidsight.errors import ConfigError
from vidsight.models.shapes import MODEL_SHAPES, shape_config


def parameter_counts(name):
    from transformers import AutoModelForImageTextToText

    config, _ = shape_config(name)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    vision = sum(p.numel() for n, p in model.named_parameters()
                 if ".visual." in f".{n}" or ".vision_tower." in f".{n}" or "multi_modal_projector" in n)
    return sum(p.numel() for p in model.parameters()) - vision, vision


# Published sizes: Qwen2.5-VL-7B-Instruct has 8.29 B parameters, -3B 3.75 B; Qwen2.5-0.5B's LM 0.49 B;
# LLaVA-OneVision-Qwen2-7B 8.03 B, of which Qwen2-7B 7.62 B; LLaVA-OneVision-Qwen2-0.5B 0.89 B;
# InternVL3-8B 7.94 B, of which Qwen2.5-7B 7.62 B; InternVL3-1B 0.94 B (its decoder's output head untied);
# Qwen3-VL-8B-Instruct 8.77 B, of which its decoder 8.19 B; Qwen3-VL-2B-Instruct 2.13 B (output head tied).
@pytest.mark.parametrize("name,total,language", [("qwen2.5-vl-7b", 8.29e9, 7.62e9), ("qwen2.5-vl-3b", 3.75e9, 3.09e9),
                                                  ("small", 0.54e9, 0.494e9), ("llava-onevision-7b", 8.03e9, 7.62e9),
                                                  ("llava-onevision-0.5b", 0.894e9, 0.494e9),
                                                  ("internvl3-8b", 7.94e9, 7.62e9), ("internvl3-1b", 0.938e9, 0.630e9),
                                                  ("qwen3-vl-8b", 8.77e9, 8.19e9), ("qwen3-vl-2b", 2.13e9, 1.72e9)])
def test_shapes_have_the_published_sizes(name, total, language):
    lm, vision = parameter_counts(name)
    assert lm + vision == pytest.approx(total, rel=0.01)
    assert lm == pytest.approx(language, rel=0.01)


def test_unknown_shape_is_refused():
    with pytest.raises(ConfigError, match="unknown model shape"):
        shape_config("qwen9")


def test_every_qwen_shape_has_a_whole_rotary_split():
    for name in (n for n, shape in MODEL_SHAPES.items() if shape.family == "qwen2_5_vl"):
        config = shape_config(name)[0].text_config
        head_dim = config.hidden_size // config.num_attention_heads
        assert sum(config.rope_parameters["mrope_section"]) * 2 == head_dim
