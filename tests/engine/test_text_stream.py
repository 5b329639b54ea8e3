"""Streamed answer text: the pieces join to the whole answer's text, each step decoding a few
tokens rather than the whole answer, in every family's tokenizer and the task model's WordPiece one."""

import types

import pytest

from vidsight.engine.text_stream import TextStream, answer_text

# Characters of one to four bytes (a byte-level tokenizer splits them over tokens), runs of white
# space, and words a WordPiece tokenizer splits into pieces.
TEXT = "Ein Würfel 🟥 moves → 左へ,  then\n\nstops. Unbelievably  done"


def streamed(adapter, ids, stop=()):
    """The pieces a `TextStream` hands out as ``ids`` come one by one, and the longest run of ids
    it decoded at a step before the last."""
    windows, pieces = [], []

    def decode_text(part):
        windows.append(len(part))
        return adapter.decode_text(part)

    stream = TextStream(types.SimpleNamespace(decode_text=decode_text), pieces.append, stop)
    for end in range(1, len(ids) + 1):
        stream(ids[:end])
    steps = list(windows)
    stream.finish(ids)
    return pieces, max(steps)


@pytest.fixture(params=["family", "task model"])
def any_tokenizer_adapter(request, family_adapter):
    from vidsight.models import TASK_MODEL, load_model

    return family_adapter if request.param == "family" else load_model(TASK_MODEL, "cpu")


def test_pieces_join_to_the_whole_answer_decoding_a_few_tokens_a_step(any_tokenizer_adapter):
    adapter = any_tokenizer_adapter
    end = sorted(adapter.eos_token_ids)[0]
    ids = adapter.text_ids(TEXT) * 3 + [end] + adapter.text_ids(" after the end")
    pieces, window = streamed(adapter, ids)
    assert "".join(pieces) == answer_text(adapter.decode_text(ids))
    assert window <= 12 < len(ids)   # a few tokens a step, not the answer so far
    whole = adapter.decode_text(ids)
    stop = next(whole[k:k + 3] for k in range(len(whole) // 3, len(whole))
                if len(whole[k:k + 3].strip()) == 3 and "\ufffd" not in whole[k:k + 3])
    pieces, _ = streamed(adapter, ids, (stop,))
    assert "".join(pieces) == answer_text(whole, (stop,)) != answer_text(whole)
