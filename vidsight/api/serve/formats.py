"""The answer format a chat completion asks for, in OpenAI's and vLLM's words, as vidsight's
named settings (`settings.FORMAT_SETTINGS`).

OpenAI's ``response_format`` (``json_object``, ``json_schema``); vLLM's ``structured_outputs``
(``json``, ``regex``, ``grammar``, ``json_object``, ``disable_any_whitespace``; its ``choice`` is
scored, `ChatCompletionRequest.choices`) and the older ``guided_json``, ``guided_regex`` and
``guided_grammar`` fields. One format at most; anything else is refused, not ignored.
"""

from __future__ import annotations

import json
from typing import Any

from vidsight.api.serve.media import RequestError

STRUCTURED = {"json": "answer_schema", "regex": "answer_regex", "grammar": "answer_grammar",
              "json_object": "answer_schema", "choice": None}
GUIDED = {"guided_json": "answer_schema", "guided_regex": "answer_regex", "guided_grammar": "answer_grammar"}
ANY_OBJECT = '{"type": "object"}'


def _schema_text(schema: Any, where: str) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, (dict, bool)):
        return json.dumps(schema)
    raise RequestError(400, f"{where} must be a JSON schema (an object or its text)")


def format_settings(response_format: dict | None, structured: dict | None, guided: dict[str, Any],
                    choosing: bool) -> dict[str, Any]:
    """The named settings of a request's answer format (none for free text); ``choosing``: the
    request also gives answers to choose from (``choice`` or ``guided_choice``)."""
    given: list[tuple[str, str, Any]] = []   # (where, setting, value)
    kind = (response_format or {}).get("type", "text")
    if kind == "json_object":
        given.append(("response_format", "answer_schema", ANY_OBJECT))
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise RequestError(400, "response_format json_schema needs 'json_schema': {'name': ..., 'schema': {...}}")
        given.append(("response_format", "answer_schema", _schema_text(spec["schema"], "json_schema.schema")))
    elif kind != "text":
        raise RequestError(400, f"response_format {kind!r} is not supported; text, json_object and json_schema are")
    structured = dict(structured or {})
    compact = structured.pop("disable_any_whitespace", False)
    unknown = sorted(set(structured) - set(STRUCTURED))
    if unknown:
        raise RequestError(400, f"structured_outputs {', '.join(unknown)} is not supported; "
                                f"{', '.join(sorted(STRUCTURED))} are")
    for key, value in structured.items():
        if key == "choice" or value is None or value is False:
            continue
        if key == "json_object":
            given.append(("structured_outputs.json_object", "answer_schema", ANY_OBJECT))
        elif key == "json":
            given.append(("structured_outputs.json", "answer_schema", _schema_text(value, "structured_outputs.json")))
        elif isinstance(value, str):
            given.append((f"structured_outputs.{key}", STRUCTURED[key], value))
        else:
            raise RequestError(400, f"structured_outputs.{key} must be a text")
    for key, value in guided.items():
        if value is not None:
            text = _schema_text(value, key) if key == "guided_json" else value
            if not isinstance(text, str):
                raise RequestError(400, f"{key} must be a text")
            given.append((key, GUIDED[key], text))
    if len(given) + choosing > 1:
        named = [where for where, _, _ in given] + (["a choice"] if choosing else [])
        raise RequestError(400, f"one answer format at most, not {', '.join(named)}")
    if not given:
        return {}
    _, setting, value = given[0]
    return {setting: value, "compact_json": bool(compact)}
