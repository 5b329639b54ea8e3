"""A word-level tokenizer for the task language, carrying Qwen2.5-VL's chat special tokens."""

from __future__ import annotations

from vidsight.tasks.families import vocabulary
from vidsight.models.tiny import CHAT_TEMPLATE, SPECIAL_TOKENS

UNKNOWN = "[UNK]"


def build_task_tokenizer():
    """Lower-cased words and punctuation, one token each; unknown words map to ``[UNK]``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [UNKNOWN, *vocabulary()]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=UNKNOWN))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=UNKNOWN, eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
