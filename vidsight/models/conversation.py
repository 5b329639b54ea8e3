"""A conversation around one video (or none): what a chat client sends (a system message, earlier
turns, the question to answer), rendered by the checkpoint's own chat template (`VLMAdapter.build_prompt`).

A plain question is the conversation of one user turn, the video and then the question, which is
what `ask` has always prompted with; the template adds its own default system turn where it has one.
"""

from __future__ import annotations

import dataclasses
import json

from vidsight.errors import ConfigError

ROLES = ("system", "user", "assistant", "tool")
# The tags around a reasoning model's thinking (Qwen3's, DeepSeek-R1's).
THINK_TAGS = ("<think>", "</think>")
# `apply_chat_template`'s own parameters, which a conversation's template arguments may not set.
TEMPLATE_PARAMETERS = frozenset({"conversation", "messages", "tools", "documents", "chat_template",
                                 "add_generation_prompt", "continue_final_message", "tokenize", "padding",
                                 "truncation", "max_length", "return_tensors", "return_dict",
                                 "return_assistant_tokens_mask", "tokenizer_kwargs"})
MAX_QUESTION_CHARS = 20000
# All the text of a conversation together (earlier turns included), so a prompt stays bounded.
MAX_CONVERSATION_CHARS = 100000


class _Visual:
    """Where the video (`VIDEO_PART`) or the still image (`IMAGE_PART`) goes among a message's parts."""

    def __init__(self, name: str, template_type: str):
        self._name, self.template_type = name, template_type

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self) -> str:
        return self._name   # unpickled as this module's one instance, so identity checks hold


VIDEO_PART = _Visual("VIDEO_PART", "video")
# A still image, shown as its family's image processor shows one (`VLMAdapter.still_vision`).
IMAGE_PART = _Visual("IMAGE_PART", "image")


def check_question(question: str, what: str = "question") -> None:
    """Refuse an empty or overlong question (or a watch's query) before any work is done."""
    if not isinstance(question, str) or not question.strip():
        raise ConfigError(f"the {what} is empty")
    if len(question) > MAX_QUESTION_CHARS:
        raise ConfigError(f"the {what} is {len(question)} characters; at most {MAX_QUESTION_CHARS} are accepted")


def check_template_kwargs(kwargs) -> None:
    """Refuse chat template arguments that are not a mapping of names, or that would set one of
    `apply_chat_template`'s own parameters."""
    if not isinstance(kwargs, dict) or not all(isinstance(key, str) for key in kwargs):
        raise ConfigError("chat template arguments are a mapping of names to values")
    reserved = sorted(TEMPLATE_PARAMETERS & set(kwargs))
    if reserved:
        raise ConfigError(f"chat template arguments may not set {', '.join(reserved)} (the conversation's own)")


@dataclasses.dataclass(frozen=True)
class Message:
    """One turn: its role and its parts in order, each a text, `VIDEO_PART` or `IMAGE_PART`.

    Attributes:
        role: ``system``, ``user``, ``assistant`` or ``tool`` (a function's result).
        parts: Texts and the video or image.
        tool_calls: An assistant's calls of the tools offered, each ``{"id", "type": "function",
            "function": {"name", "arguments"}}`` (OpenAI's form; the arguments as JSON text).
        tool_call_id: A tool message's: the call it answers.
    """

    role: str
    parts: tuple[str | _Visual, ...]
    tool_calls: tuple[dict, ...] = ()
    tool_call_id: str | None = None

    @property
    def text(self) -> str:
        return "".join(part for part in self.parts if isinstance(part, str))

    def template_form(self) -> dict:
        """The message as chat templates take it: text alone as a string (what every template
        reads), a message with the video or image as a list of typed parts (what vision templates
        read); tool calls with their arguments as objects, as templates write them (and vLLM gives them)."""
        content = self.text if all(isinstance(part, str) for part in self.parts) else [
            {"type": "text", "text": part} if isinstance(part, str) else {"type": part.template_type}
            for part in self.parts]
        form = {"role": self.role, "content": content}
        if self.tool_calls:
            form["tool_calls"] = [{**call, "function": {**call["function"], "arguments": _arguments(call)}}
                                  for call in self.tool_calls]
        if self.tool_call_id is not None:
            form["tool_call_id"] = self.tool_call_id
        return form


def _arguments(call: dict):
    arguments = call["function"].get("arguments")
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return arguments   # not JSON: written as the client sent it


@dataclasses.dataclass(frozen=True)
class Conversation:
    """Messages around at most one video or still image (text alone, as a chat client's title or
    small talk, is answered too), ending with the user's turn to answer (or with an answer begun,
    to continue).

    Attributes:
        messages: The turns in order: ``system``, ``user``, ``assistant`` and ``tool`` messages;
            the video (or image) is one part of one user message, anywhere in the conversation (a follow-up
            question comes after the answers to earlier ones); the last is the user's question
            or a tool's result, which the answer follows.
        template_kwargs: Further variables for the chat template (vLLM's ``chat_template_kwargs``,
            e.g. Qwen3's ``enable_thinking``); a template ignores those it does not read.
        tools: The functions the model may call (OpenAI's ``tools``: ``{"type": "function",
            "function": {"name", "description", "parameters"}}``), which the template lists.
        closes_thinking: A thinking block the template's generation prompt opens (a reasoning
            model's ``<think>``) is closed, empty, at the prompt's end (Qwen3's form with thinking
            off), so what follows is the answer itself: set where given answers are scored
            (choices, a watch's Yes) rather than an answer generated.
        continues_final: The last message is the assistant's answer begun, and the answer goes on
            from its last character (vLLM's ``continue_final_message``): it is rendered open, with
            no end of turn and no generation prompt, and the answer is what follows it.
    """

    messages: tuple[Message, ...]
    template_kwargs: dict = dataclasses.field(default_factory=dict)
    tools: tuple[dict, ...] = ()
    closes_thinking: bool = False
    continues_final: bool = False

    def __post_init__(self):
        check_template_kwargs(self.template_kwargs)
        if not self.messages:
            raise ConfigError("a conversation needs at least one message")
        for message in self.messages:
            if message.role not in ROLES:
                raise ConfigError(f"a message's role must be one of {', '.join(ROLES)}, not {message.role!r}")
            if any(not isinstance(part, str) and part not in (VIDEO_PART, IMAGE_PART) for part in message.parts):
                raise ConfigError("a message's parts are texts and the video or image")
        visuals = [(message.role, part) for message in self.messages for part in message.parts
                   if not isinstance(part, str)]
        if len(visuals) > 1:
            raise ConfigError(f"a conversation holds at most one video or image, not {len(visuals)}")
        if visuals and visuals[0][0] != "user":
            raise ConfigError(f"the {visuals[0][1].template_type} must be in a user message, not the {visuals[0][0]}'s")
        last = self.messages[-1]
        if self.continues_final:
            with_media = any(not isinstance(part, str) for part in last.parts)
            if last.role != "assistant" or not last.text.strip() or last.tool_calls or with_media:
                raise ConfigError("to continue the final message it must be the assistant's, holding the text of an "
                                  "answer begun (no tool calls)")
        elif last.role not in ("user", "tool"):
            raise ConfigError(f"the last message must be the user's (or a tool's result), to answer, not the "
                              f"{last.role}'s (an answer begun is continued with continue_final_message)")
        if last.role == "user":
            check_question(self.messages[-1].text, "question (the last message's text)")
        chars = sum(len(message.text) + len(json.dumps(message.tool_calls)) for message in self.messages)
        chars += len(json.dumps(self.tools)) if self.tools else 0
        if chars > MAX_CONVERSATION_CHARS:
            raise ConfigError(f"the conversation's text is {chars} characters; at most {MAX_CONVERSATION_CHARS} "
                              "are accepted")

    def continued(self, begun: str) -> "Conversation":
        """The conversation with the assistant's answer begun as ``begun``, which the answer
        continues (`continues_final`)."""
        return dataclasses.replace(self, messages=(*self.messages, Message("assistant", (begun,))), continues_final=True)

    def scored(self) -> "Conversation":
        """The conversation as a prompt for scoring given answers (`closes_thinking`)."""
        return dataclasses.replace(self, closes_thinking=True)

    @classmethod
    def of(cls, question: "str | Conversation", system: str | None = None,
           template_kwargs: dict | None = None, visual: _Visual = VIDEO_PART) -> "Conversation":
        """``question`` as a conversation: one user turn, the video (or with ``visual`` `IMAGE_PART`
        the image) then the question (after ``system``'s turn when given); a conversation as it is
        (its own system messages and template arguments stand)."""
        if isinstance(question, Conversation):
            return question
        check_question(question)
        user = Message("user", (visual, question))
        return cls((Message("system", (system,)), user) if system is not None else (user,), template_kwargs or {})

    @property
    def visual(self) -> _Visual | None:
        """`VIDEO_PART` or `IMAGE_PART`, whichever the conversation holds; None for text alone."""
        return next((part for message in self.messages for part in message.parts if not isinstance(part, str)), None)

    @property
    def still(self) -> bool:
        """Whether what the conversation is about is a still image."""
        return self.visual is IMAGE_PART

    @property
    def question(self) -> str:
        """The text of the last message: what is asked now."""
        return self.messages[-1].text

    def template_form(self) -> list[dict]:
        """The messages as ``apply_chat_template`` takes them."""
        return [message.template_form() for message in self.messages]
