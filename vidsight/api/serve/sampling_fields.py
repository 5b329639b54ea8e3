"""The sampling and ending fields a chat completion and a session message share (OpenAI's, and
vLLM's extra ones), read into named settings (`settings.ASK_SETTINGS`) in one place."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

SAMPLING_FIELDS = ("temperature", "top_p", "min_p", "min_tokens", "ignore_eos", "seed", "stop", "stop_token_ids",
                   "include_stop_str_in_output", "repetition_penalty", "frequency_penalty", "presence_penalty",
                   "logit_bias")


class SamplingFields(BaseModel):
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)   # vLLM's extra sampling parameters; -1 (or 0) is off
    min_p: float | None = Field(default=None, ge=0, le=1)
    min_tokens: int | None = Field(default=None, ge=0)
    ignore_eos: bool | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None   # vLLM's extra sampling parameter
    include_stop_str_in_output: bool | None = None   # vLLM's
    repetition_penalty: float | None = Field(default=None, gt=0)   # vLLM's extra sampling parameter
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None   # token id (as text) -> bias

    def sampling_options(self) -> dict[str, Any]:
        """The fields given, by the settings' names."""
        options = {name: getattr(self, name) for name in SAMPLING_FIELDS if getattr(self, name) is not None}
        if self.top_k is not None:
            options["top_k"] = max(self.top_k, 0)
        return options
