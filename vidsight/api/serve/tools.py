"""Tool calls: OpenAI's ``tools`` and ``tool_choice`` as vLLM serves them.

The tools are listed to the model by the checkpoint's chat template. What the answer becomes
depends on ``tool_choice``:

- ``auto`` (the default when tools are given; the server needs ``--enable-auto-tool-choice
  --tool-call-parser hermes``, as vLLM does): the model writes Hermes-style calls, each
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen's templates teach this
  form); they become ``tool_calls`` and the text before the first is ``content``.
- ``required``: the answer is held (an answer format) to a JSON array of one or more
  ``{"name", "parameters"}`` objects, one of the tools each, its parameters valid under the tool's schema.
- a named function: the answer is held to that function's parameters schema, and is its arguments.
  Both are written compactly (no white space between JSON's tokens): they are read, not shown,
  and a model cannot spend its tokens on white space.
- ``none``: the tools are listed, the answer is text.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid

from vidsight.api.serve.media import RequestError
from vidsight.engine.text_stream import without_partial_mark

TOOL_CALL_PARSERS = ("hermes",)
CALL_START, CALL_END = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(CALL_START) + r"(.*?)(?:" + re.escape(CALL_END) + r"|$)", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ToolChoice:
    """How a request's answer relates to its tools.

    Attributes:
        mode: ``none``, ``auto``, ``required`` or ``named``.
        name: The function a ``named`` choice calls.
        schema: The answer's JSON schema (``required`` and ``named``); None: free text.
        parallel: More than one call may be made (OpenAI's ``parallel_tool_calls``); else the
            first is kept (``auto``) or the answer holds one (``required``).
    """

    mode: str
    name: str | None = None
    schema: dict | None = None
    parallel: bool = True

    def calls(self, text: str) -> tuple[str | None, list[dict]]:
        """``(content, tool_calls)`` of an answer's ``text``, in OpenAI's form; no calls where the
        text holds none that parse (the text is then the content, as vLLM's parser leaves it)."""
        try:   # held answers: a call cut off at the length limit does not parse, and stays text
            if self.mode == "named":
                return None, [_call(self.name, json.dumps(json.loads(text), ensure_ascii=False))]
            if self.mode == "required":
                return None, [_call(call["name"], json.dumps(call["parameters"], ensure_ascii=False))
                              for call in json.loads(text)]
        except (ValueError, TypeError, KeyError):
            return text, []
        if self.mode == "none" or CALL_START not in text:
            return text, []
        try:
            found = [json.loads(body) for body in _CALL.findall(text)][:None if self.parallel else 1]
            calls = [_call(call["name"], json.dumps(call.get("arguments", {}), ensure_ascii=False)) for call in found]
        except (ValueError, TypeError, KeyError):
            return text, []
        content = text[:text.index(CALL_START)].strip()
        return content or None, calls

    def streamed_content(self, text: str) -> str:
        """The content of an answer's ``text`` so far that may be streamed: all of it without
        tools, none when the answer is the calls, and before a call (or what may begin one) in ``auto``."""
        if self.mode in ("named", "required"):
            return ""
        if self.mode == "none":
            return text
        at = text.find(CALL_START)
        # White space before a call is not the content's.
        return (text[:at] if at >= 0 else without_partial_mark(text, (CALL_START,))).rstrip()

    def finish_reason(self, calls: list[dict], finish_reason: str) -> str:
        """OpenAI's: ``tool_calls`` where the model chose to call (a call it was told to make ends as ``stop``)."""
        return "tool_calls" if calls and self.mode != "named" and finish_reason == "stop" else finish_reason


def _call(name: str, arguments: str) -> dict:
    return {"id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def tool_choice(tools: list | None, choice, parser: str | None, parallel: bool = True) -> ToolChoice:
    """The request's `ToolChoice`, its tools and choice checked (400 naming the problem)."""
    if not tools:
        if choice not in (None, "none"):
            raise RequestError(400, "tool_choice needs tools")
        return ToolChoice("none")
    functions = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise RequestError(400, 'each tool is {"type": "function", "function": {"name": ..., "parameters": ...}}')
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict):
            raise RequestError(400, f"tool {function['name']}: parameters must be a JSON schema object")
        functions[function["name"]] = parameters
    choice = "auto" if choice is None else choice
    if choice == "none":
        return ToolChoice("none")
    if choice == "auto":
        if parser is None:
            raise RequestError(400, '"auto" tool choice needs a server started with --enable-auto-tool-choice '
                                    "--tool-call-parser hermes")
        return ToolChoice("auto", parallel=parallel)
    if choice == "required":
        calls = [{"type": "object", "properties": {"name": {"const": name}, "parameters": parameters},
                  "required": ["name", "parameters"], "additionalProperties": False}
                 for name, parameters in functions.items()]
        one = {} if parallel else {"maxItems": 1}
        return ToolChoice("required", schema={"type": "array", "minItems": 1, **one, "items": {"anyOf": calls}},
                          parallel=parallel)
    name = ((choice.get("function") or {}).get("name") if isinstance(choice, dict) and choice.get("type") == "function"
            else None)
    if name is None:
        raise RequestError(400, 'tool_choice is "none", "auto", "required" or {"type": "function", "function": '
                                '{"name": ...}}')
    if name not in functions:
        raise RequestError(400, f"tool_choice names {name!r}, which is not among the tools ({', '.join(functions)})")
    return ToolChoice("named", name, functions[name])
