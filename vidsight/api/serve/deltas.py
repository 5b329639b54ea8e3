"""One answer as OpenAI's message, or as its chunks' deltas: the thinking as ``reasoning`` (with a
reasoning parser), the text as ``content`` up to any tool call, the calls as ``tool_calls``.

Streamed and whole alike: the deltas of a stream join to the whole answer's message.
"""

from __future__ import annotations

from vidsight.api.serve.tools import ToolChoice
from vidsight.engine.reasoning import REASONING_PARSERS, ReasoningStream


def reasoning_of(text: str | None) -> dict:
    """An answer's thinking as vLLM gives it: ``reasoning``, and its older name ``reasoning_content``
    (still read by many clients); nothing where there is none."""
    return {} if not text else {"reasoning": text, "reasoning_content": text}


def message_of(result, tools: ToolChoice) -> tuple[dict, str]:
    """The assistant's message of an answer (`AskResult`) and its finish reason."""
    content, calls = tools.calls(result.answer)
    message = {"role": "assistant", **reasoning_of(result.reasoning), "content": content}
    if calls:
        message["tool_calls"] = calls
    return message, tools.finish_reason(calls, result.finish_reason)


class StreamedAnswer:
    """One answer's text, piece by piece, as chunk deltas.

    Args:
        tools: How the answer relates to the request's tools.
        reasoning_parser: The server's (`GenerationConfig.reasoning_parser`), or None.
        starts_thinking: The answer began inside the thinking (`Answer.starts_thinking`).
    """

    def __init__(self, tools: ToolChoice, reasoning_parser: str | None, starts_thinking: bool):
        self.tools = tools
        self.reasoning = (ReasoningStream(REASONING_PARSERS[reasoning_parser], starts_thinking)
                          if reasoning_parser is not None else None)
        self.content, self.shown, self.calls = "", "", []

    def feed(self, text: str, final: bool = False) -> dict:
        """The delta a piece of the answer's text adds (empty when it adds nothing to show yet);
        ``final``: the answer has ended, and what was held back comes out, with any tool calls."""
        reasoning = ""
        if self.reasoning is not None:
            reasoning, text = self.reasoning.feed(text, final)
        self.content += text
        if final:
            content, self.calls = self.tools.calls(self.content)
            visible = content or "" if self.calls else self.content
        else:
            visible = self.tools.streamed_content(self.content)
        added, self.shown = visible[len(self.shown):], visible
        delta = {**reasoning_of(reasoning), **({"content": added} if added else {})}
        if self.calls:
            delta["tool_calls"] = [{"index": index, **call} for index, call in enumerate(self.calls)]
        return delta

    def finish_reason(self, finish_reason: str) -> str:
        return self.tools.finish_reason(self.calls, finish_reason)
