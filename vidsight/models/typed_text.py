"""Token ids of a prompt whose text a client typed, where a special token's string in that text
stays characters.

A chat template renders a conversation to one string, and the tokenizer reads every special
token's string in it as that token: so a question holding ``<video>`` (LLaVA-OneVision's and
InternVL's video mark) gets a second video placeholder, and one holding ``<|im_end|>`` closes its
turn and can forge the next (what transformers' processors do, and tiktoken refuses by default).
Here the template's own markup is read as tokens and the client's text as text: the rendered
prompt is tokenized whole, as before (so a prompt without such strings has exactly the ids it
always had), and each special token that came from a client's text is replaced by the ids of its
characters. A special token is an added token on its own, so the tokens around it are the same
either way.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from typing import Callable

from vidsight.errors import ModelError
from vidsight.models.conversation import Conversation, Message


def special_strings(tokenizer) -> tuple[str, ...]:
    """The strings a tokenizer reads as special tokens, longest first (so a pattern of them
    matches ``<|video_pad|>`` before a shorter token inside it)."""
    specials = {token.content for token in tokenizer.added_tokens_decoder.values() if token.special}
    return tuple(sorted(specials, key=len, reverse=True))


def plain_ids(tokenizer, text: str) -> list[int]:
    """``text``'s token ids, a special token's string in it read as its characters."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def _client_texts(conversation: Conversation):
    """Every text the client wrote: the messages', and those in the template arguments, tools and calls."""
    values = [[message.text, message.tool_calls, message.tool_call_id] for message in conversation.messages]
    values += [conversation.template_kwargs, conversation.tools]
    while values:
        value = values.pop()
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            values.extend(value.values())
        elif isinstance(value, (list, tuple)):
            values.extend(value)


def prompt_ids(tokenizer, specials: tuple[str, ...], render: Callable[[Conversation], str],
               conversation: Conversation) -> list[int]:
    """The ids of ``render(conversation)`` (a chat template's text), the special-token strings the
    conversation's messages hold read as characters.

    Args:
        tokenizer: A fast tokenizer (its offsets locate each token in the text).
        specials: `special_strings` of ``tokenizer``.
        render: The chat template: a conversation to the prompt's text.
        conversation: What the client sent.
    """
    pattern = re.compile("|".join(map(re.escape, specials))) if specials else None
    if pattern is None or not any(pattern.search(text) for text in _client_texts(conversation)):
        return tokenizer(render(conversation), add_special_tokens=False)["input_ids"]
    if not tokenizer.is_fast:
        raise ModelError("a special token's string in a message can only be read as text with a fast tokenizer")
    # Each typed special string becomes a mark the template passes through as text; the nonce keeps
    # a client's own text from posing as a mark.
    nonce, typed = secrets.token_hex(8), []

    def mark(text: str) -> str:
        def one(found: re.Match) -> str:
            typed.append(found.group())
            return f"\ue000{nonce}:{len(typed) - 1}\ue001"
        return pattern.sub(one, text)

    def marked_value(value):   # the texts of template arguments, tools and calls are the client's too
        if isinstance(value, str):
            return mark(value)
        if isinstance(value, dict):
            return {key: marked_value(item) for key, item in value.items()}
        return [marked_value(item) for item in value] if isinstance(value, (list, tuple)) else value

    marked = dataclasses.replace(
        conversation, messages=tuple(Message(message.role, tuple(mark(part) if isinstance(part, str) else part
                                                                 for part in message.parts),
                                             tuple(marked_value(message.tool_calls)), marked_value(message.tool_call_id))
                                     for message in conversation.messages),
        template_kwargs=marked_value(conversation.template_kwargs), tools=tuple(marked_value(conversation.tools)))
    text, spans = _unmark(render(marked), nonce, typed)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, span = [], 0
    for token, (start, end) in zip(encoding["input_ids"], encoding["offset_mapping"]):
        while span < len(spans) and spans[span][1] <= start:
            span += 1
        if span < len(spans) and spans[span][0] <= start < spans[span][1]:
            if start == spans[span][0]:
                ids.extend(plain_ids(tokenizer, text[spans[span][0]:spans[span][1]]))
            continue
        ids.append(token)
    return ids


def _unmark(rendered: str, nonce: str, typed: list[str]) -> tuple[str, list[tuple[int, int]]]:
    """``rendered`` with its marks put back as the strings typed, and the ``(start, end)`` character
    span of each in the result (in order; a template may write a message more than once)."""
    parts, spans, length, at = [], [], 0, 0
    for found in re.finditer(f"\ue000{nonce}:(\\d+)\ue001", rendered):
        parts.append(rendered[at:found.start()])
        length += found.start() - at
        string = typed[int(found.group(1))]
        parts.append(string)
        spans.append((length, length + len(string)))
        length += len(string)
        at = found.end()
    parts.append(rendered[at:])
    return "".join(parts), spans
