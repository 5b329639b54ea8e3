"""A byte-level BPE tokenizer of Qwen2's vocabulary size, trained on generated text, for costs
that depend on a real vocabulary's size (no real checkpoint's tokenizer can be fetched here)."""

from __future__ import annotations

import random
import string

QWEN2_VOCAB = 151643


def trained_tokenizer():
    """The tokenizer (about 10 s to train): byte-level BPE of `QWEN2_VOCAB` tokens with Qwen's
    three special tokens, ``<|im_end|>`` its end token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(400000)]
    corpus = (" ".join(rng.choices(words, k=1000)) + ' {"a": 1.5, "b": [true, null]}\n' for _ in range(4000))
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=QWEN2_VOCAB, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>")
