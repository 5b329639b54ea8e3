"""A reasoning model's answer in two parts, as vLLM's reasoning parsers give it: the thinking
between ``<think>`` and ``</think>`` (``reasoning``) and the answer after it (``content``).

Where the answer starts is read from the prompt: a template that opens a think block at the
end of its generation prompt (Qwen3-VL-Thinking's, DeepSeek-R1's) starts the answer inside the
thinking, and one that closes it there (Qwen3's with ``enable_thinking`` off) starts it at the
content; otherwise the answer is content unless it opens a think block itself. Whole and
streamed answers split alike: the pieces of a stream join to the whole answer's parts.
"""

from __future__ import annotations

import dataclasses

from vidsight.engine.text_stream import without_partial_mark
from vidsight.errors import ConfigError
from vidsight.models.conversation import THINK_TAGS


@dataclasses.dataclass(frozen=True)
class ReasoningParser:
    """The tags around a model's thinking.

    Attributes:
        name: vLLM's name for the parser (``--reasoning-parser``).
        start: The text that opens the thinking (one token of the model's vocabulary).
        end: The text that closes it.
    """

    name: str
    start: str = THINK_TAGS[0]
    end: str = THINK_TAGS[1]

    def tag_ids(self, adapter) -> tuple[int, int]:
        """The ids of the two tags in ``adapter``'s vocabulary; refused where the model has no
        such tokens, or where decoding drops them (special tokens), so they could not be read."""
        ids = []
        for tag in (self.start, self.end):
            found = adapter.tokenizer.convert_tokens_to_ids(tag)
            if not isinstance(found, int) or found == adapter.tokenizer.unk_token_id or adapter.decode_text([found]) != tag:
                raise ConfigError(f"--reasoning-parser {self.name}: {adapter.name} has no {tag} token that decodes "
                                  "to its text; its answers hold no thinking to part")
            ids.append(found)
        return ids[0], ids[1]

    def thinking_at_start(self, adapter, prompt_ids: list[int]) -> bool:
        """Whether an answer to ``prompt_ids`` begins inside the thinking (the prompt's last tag opens it)."""
        start, end = self.tag_ids(adapter)
        last = {token: index for index, token in enumerate(prompt_ids) if token in (start, end)}
        return last.get(start, -1) > last.get(end, -1)

    def split(self, text: str, thinking: bool, final: bool = True) -> tuple[str | None, str]:
        """``(reasoning, content)`` of an answer's ``text`` (white space around each part
        stripped); reasoning is None when the answer holds no thinking. Before the answer ends
        (not ``final``), a tail that may begin a tag is held back, so each part only grows."""
        if not thinking:
            opened = text.lstrip()
            if not opened.startswith(self.start):
                if not final and self.start.startswith(opened):
                    return None, ""   # may yet open a think block
                return None, text.strip()
            text, thinking = opened[len(self.start):], True
        at = text.find(self.end)
        if at >= 0:
            return text[:at].strip(), text[at + len(self.end):].strip()
        if not final:
            text = without_partial_mark(text, (self.end,))
        return text.strip(), ""


REASONING_PARSERS = {name: ReasoningParser(name) for name in ("qwen3", "deepseek_r1")}


class ReasoningStream:
    """Streamed answer text parted into reasoning and content pieces as it comes.

    Args:
        parser: The tags.
        thinking: The answer begins inside the thinking (`ReasoningParser.thinking_at_start`).
    """

    def __init__(self, parser: ReasoningParser, thinking: bool):
        self.parser, self.thinking = parser, thinking
        self.text, self.shown = "", (None, "")

    def feed(self, piece: str, final: bool = False) -> tuple[str, str]:
        """``(reasoning, content)`` the answer's next ``piece`` of text adds (either may be empty)."""
        self.text += piece
        now = self.parser.split(self.text, self.thinking, final)
        # Each part only grows (`split` holds back what may change), so what is new is its tail.
        added = tuple((part or "")[len(shown or ""):] for shown, part in zip(self.shown, now))
        self.shown = now
        return added

    def finish(self) -> tuple[str, str]:
        """What was still held back, once the answer has ended."""
        return self.feed("", final=True)
