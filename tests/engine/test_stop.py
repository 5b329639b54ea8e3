"""Stop strings (OpenAI's ``stop``): an answer ends at the token that completes one, its text ends
before it, and streamed text never shows one."""

import pytest

from vidsight.engine import Asker, GenerationConfig
from vidsight.engine.generate import answer_text
from vidsight.errors import ConfigError
from vidsight.ingest import SamplingConfig

QUESTION = "What colour is the square?"
SAMPLING = SamplingConfig(fps=2.0)


def test_the_text_ends_before_the_first_stop_string_and_a_possible_beginning_waits():
    assert answer_text(" Red. Then blue.\nQ: why", ("\nQ:", ". T")) == "Red"
    assert answer_text(" Red.\n", ("\nQ:",)) == "Red."
    assert answer_text(" Red.\n", ("\nQ:",), final=False) == "Red."   # "\n" may begin "\nQ:": held back
    assert answer_text("Red.\nQ", ("\nQ:",), final=False) == "Red."
    assert answer_text("\nRed", ("\n",)) == ""                       # stops before anything, as vLLM does
    assert answer_text(" Red ", ()) == answer_text(" Red ", (), final=False) == "Red"


def test_stop_settings_are_checked():
    assert GenerationConfig(stop="\n").stop == ("\n",) and GenerationConfig(stop=["a", "b"]).stop == ("a", "b")
    for bad in ([""], ["x"] * 17, ["x" * 257], [3]):
        with pytest.raises(ConfigError, match="stop takes at most 16 strings"):
            GenerationConfig(stop=bad)


def test_an_answer_stops_at_the_token_that_completes_a_stop_string(tiny_adapter, make_test_video):
    path, _ = make_test_video(duration_s=2.0)
    asker = Asker(tiny_adapter)
    whole = asker.ask(path, QUESTION, sampling=SAMPLING, generation=GenerationConfig(max_new_tokens=12))
    ids, decode = whole.token_ids, tiny_adapter.decode_text
    assert whole.finish_reason == "length" and len(ids) == 12   # the random model ends on the limit
    # A stop string from the middle of the answer: the answer ends at the first token whose text completes it.
    stop = next(text for k in range(4, 10) if len(text := decode(ids[k:k + 2]).strip()) >= 2 and "\ufffd" not in text)
    completes = next(k for k in range(len(ids)) if stop in decode(ids[:k + 1]))
    pieces = []
    stopped = asker.ask(path, QUESTION, sampling=SAMPLING, generation=GenerationConfig(max_new_tokens=12, stop=(stop,)),
                        on_text=pieces.append)
    assert stopped.token_ids == ids[:completes + 1] and stopped.finish_reason == "stop"
    assert stopped.answer == decode(ids).split(stop, 1)[0].strip() and stop not in stopped.answer
    assert "".join(pieces) == stopped.answer
    assert stopped.to_dict()["finish_reason"] == "stop"
