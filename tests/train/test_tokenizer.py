import pytest

from vidsight.tasks.families import FAMILIES, make_sample
from vidsight.train.tokenizer import UNKNOWN, build_task_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_task_tokenizer()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_question_and_answer_tokenises_without_unknown_words(tokenizer, family):
    unknown = tokenizer.convert_tokens_to_ids(UNKNOWN)
    for seed in range(30):
        sample = make_sample(family, seed)
        for text in (sample.question, sample.answer):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            assert unknown not in ids, text
            assert tokenizer.decode(ids).replace(" ?", "?").replace(" .", ".").replace(" ,", ",") == text.lower()


def test_answers_are_single_tokens(tokenizer):
    for family in FAMILIES:
        for seed in range(10):
            assert len(tokenizer(make_sample(family, seed).answer, add_special_tokens=False)["input_ids"]) == 1


def test_chat_format_special_tokens_survive(tokenizer):
    text = "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>How many objects are there?<|im_end|>"
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert tokens[:5] == ["<|im_start|>", "user", "<|vision_start|>", "<|video_pad|>", "<|vision_end|>"]
    assert tokens[-1] == "<|im_end|>"
