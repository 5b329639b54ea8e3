"""``POST /v1/chat/completions`` as vLLM serves it for video: messages whose content mixes ``text``
and a ``video_url`` (or ``image_url``) part; vidsight's own settings in ``media_io_kwargs`` /
``mm_processor_kwargs``."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vidsight.api.serve.formats import format_settings
from vidsight.api.serve.media import RequestError
from vidsight.api.serve.sampling_fields import SamplingFields
from vidsight.api.serve.tools import ToolChoice
from vidsight.api.settings import ASK_SETTINGS
from vidsight.errors import ConfigError
from vidsight.models.conversation import IMAGE_PART, VIDEO_PART, Conversation, Message

# Video settings a request may give, by vidsight's names (`settings.ASK_SETTINGS`) and vLLM's
# ``num_frames``; generation settings come from the request's own fields.
PROCESSOR_KWARGS = {**{name: name for name, (config, _) in ASK_SETTINGS.items() if config != "generation"},
                    "num_frames": "max_frames", "video_start": "start_s", "video_end": "end_s"}
# A structured-output choice's bounds: each answer given is scored, so their number and length are capped.
MAX_CHOICES, MAX_CHOICE_CHARS = 64, 1000
# Answers one request may ask for (``n``): each is decoded beside the others, so they are capped.
MAX_ANSWERS = 16


class MediaURL(BaseModel):
    url: str = Field(min_length=1)   # OpenAI's ``detail`` of an image is not read: the checkpoint's bounds rule


# The conversation's part each kind of media part becomes.
MEDIA_PARTS = {"video_url": VIDEO_PART, "image_url": IMAGE_PART}


class Part(BaseModel):
    type: Literal["text", "video_url", "image_url", "input_audio"]
    text: str | None = None
    video_url: MediaURL | None = None
    image_url: MediaURL | None = None

    @model_validator(mode="after")
    def _filled(self):
        if self.type == "text" and self.text is None:
            raise ValueError("a text part needs 'text'")
        if self.type in MEDIA_PARTS and getattr(self, self.type) is None:
            raise ValueError(f"a {self.type} part needs '{self.type}': {{'url': ...}}")
        return self

    @property
    def url(self) -> str | None:
        """A media part's URL."""
        return getattr(self, self.type).url if self.type in MEDIA_PARTS else None


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[Part] | None = None   # None: an assistant's turn of tool calls only
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _filled(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant's message holds tool_calls")
        for call in self.tool_calls or ():
            function = call.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise ValueError('a tool call is {"id": ..., "type": "function", "function": {"name": ..., '
                                 '"arguments": ...}}')
        return self


class ChatCompletionRequest(SamplingFields):
    """The fields of OpenAI's chat completion request that vidsight reads (its sampling fields in
    `SamplingFields`); others are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # OpenAI's answer formats (`formats`) and tools (`tools`).
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    n: int = Field(default=1, ge=1, le=MAX_ANSWERS)
    # vLLM's ways to ask for one of given answers: structured outputs' ``choice`` (``guided_choice`` before it).
    structured_outputs: dict[str, Any] | None = None
    guided_choice: list[str] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None   # vLLM's: further variables for the chat template
    # vLLM's: the last message is an answer begun, which the answer continues (then without a generation prompt).
    continue_final_message: bool = False
    add_generation_prompt: bool = True

    def video_and_conversation(self, default_template_kwargs: dict | None = None) -> tuple[str | None, Conversation]:
        """The video's or image's URL (None for a request of text alone) and the conversation
        around it (`Conversation.still` for an image; system
        messages, earlier turns and tool calls, the question in the last user message, a tool's
        result in the last tool message, or with ``continue_final_message`` an answer begun in the
        last assistant message); OpenAI's ``developer`` role is its ``system``. The request's chat
        template arguments go over ``default_template_kwargs`` (the server's)."""
        videos, messages = [], []
        for message in self.messages:
            role = "system" if message.role == "developer" else message.role
            content = message.content or ""
            parts = [Part(type="text", text=content)] if isinstance(content, str) else content
            unsupported = sorted({p.type for p in parts} - {"text", *MEDIA_PARTS})
            if unsupported:
                raise RequestError(400, f"{', '.join(unsupported)} parts are not supported; send text and at most one "
                                        "video_url or image_url")
            media = [p for p in parts if p.type in MEDIA_PARTS]
            if role != "user" and media:
                raise RequestError(400, f"the {MEDIA_PARTS[media[0].type].template_type} must be in a user message, "
                                        f"not the {message.role}'s")
            videos += [p.url for p in media]
            messages.append(Message(role, tuple(MEDIA_PARTS.get(p.type, p.text) for p in parts),
                                    tuple(message.tool_calls or ()), message.tool_call_id))
        if len(videos) > 1:
            raise RequestError(400, f"a request holds at most one video_url or image_url part, got {len(videos)}")
        if self.continue_final_message == self.add_generation_prompt:
            raise RequestError(400, "continue_final_message: true goes with add_generation_prompt: false, and only "
                                    "with it (an answer begun is continued, not followed by a new one)")
        try:
            template_kwargs = {**(default_template_kwargs or {}), **(self.chat_template_kwargs or {})}
            return (videos or [None])[0], Conversation(tuple(messages), template_kwargs, tuple(self.tools or ()),
                                           continues_final=self.continue_final_message)
        except ConfigError as exc:
            raise RequestError(400, str(exc)) from exc

    def _given_choices(self):
        return (self.structured_outputs or {}).get("choice", self.guided_choice)

    def choices(self) -> list[str] | None:
        """The answers the reply must be one of (vLLM's ``structured_outputs.choice`` or
        ``guided_choice``), scored instead of generated; None for a free-text answer."""
        choices = self._given_choices()
        if choices is None:
            return None
        if (not isinstance(choices, list) or not 1 <= len(choices) <= MAX_CHOICES
                or not all(isinstance(c, str) and c.strip() and len(c) <= MAX_CHOICE_CHARS for c in choices)):
            raise RequestError(400, f"choice must be a list of 1 to {MAX_CHOICES} non-empty strings of at most "
                                    f"{MAX_CHOICE_CHARS} characters")
        if self.logprobs or self.stop or self.n > 1:
            raise RequestError(400, "choice answers with the likeliest of the answers given; logprobs, stop and n "
                                    "apply to generated answers")
        return choices

    def ask_options(self, tools: ToolChoice = ToolChoice("none")) -> dict[str, Any]:
        """The `ask` settings the request gives, by the CLI's names (``tools``: how its answer
        relates to its tools, `tool_choice`)."""
        given = dict((self.media_io_kwargs or {}).get("video", {}))
        unknown_io = sorted(set((self.media_io_kwargs or {})) - {"video"})
        given.update(self.mm_processor_kwargs or {})
        unknown = sorted(set(given) - set(PROCESSOR_KWARGS)) + [f"media_io_kwargs.{k}" for k in unknown_io]
        if unknown:
            raise RequestError(422, f"unknown video settings: {', '.join(unknown)}; known: "
                                    f"{', '.join(PROCESSOR_KWARGS)}")
        options = {PROCESSOR_KWARGS[key]: value for key, value in given.items()}
        limit = self.max_completion_tokens or self.max_tokens
        if limit is not None:
            options["max_new_tokens"] = limit
        choosing = self._given_choices() is not None
        options.update(format_settings(self.response_format, self.structured_outputs,
                                       {"guided_json": self.guided_json, "guided_regex": self.guided_regex,
                                        "guided_grammar": self.guided_grammar}, choosing))
        if tools.schema is not None:
            if any(key.startswith("answer_") for key in options):
                raise RequestError(400, f"tool_choice {tools.mode} holds the answer to the calls; give no other "
                                        "answer format")
            # Compact: the calls are read, not shown, and a model cannot loop on white space.
            options.update(answer_schema=json.dumps(tools.schema), compact_json=True)
        options.update(self.sampling_options())
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError(422, "top_logprobs needs logprobs: true")
        if self.logprobs:
            options["logprobs"] = self.top_logprobs or 0
        return options


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def logprobs_of(entries: list | None) -> dict | None:
    """OpenAI's ``logprobs`` of a choice: ``{"content": [...]}`` of `TokenLogprob` entries, or None."""
    return None if entries is None else {"content": [entry.to_dict() for entry in entries]}


def completion(request_id: str, model: str, answers: list[tuple[dict, str, list | None]], usage: dict) -> dict:
    """OpenAI's chat completion of ``answers``, each ``(message, finish_reason, logprobs)``."""
    return {"id": request_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "message": message, "finish_reason": finish_reason,
                         "logprobs": logprobs_of(logprobs)}
                        for index, (message, finish_reason, logprobs) in enumerate(answers)],
            "usage": usage}


def chunk(request_id: str, model: str, delta: dict, finish_reason: str | None = None,
          usage: dict | None = None, logprobs: list | None = None, index: int = 0) -> dict:
    choices = [] if usage is not None else [{"index": index, "delta": delta, "finish_reason": finish_reason,
                                             "logprobs": logprobs_of(logprobs)}]
    out = {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
           "choices": choices}
    if usage is not None:
        out["usage"] = usage
    return out


def usage_of(stats) -> dict:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
            "total_tokens": stats.prompt_tokens + stats.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}}
