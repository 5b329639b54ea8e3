"""`vidsight serve`'s settings (torch-free, so `--help` starts fast)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from vidsight.errors import ConfigError

API_KEY_ENV = "VIDSIGHT_API_KEY"
# vLLM's defaults where it has one: no local media unless allowed, a fetch timeout of seconds.
DEFAULT_MAX_VIDEO_BYTES = 512 * 2**20
DEFAULT_FETCH_TIMEOUT_S = 30.0
DEFAULT_MAX_CONCURRENT = 64
# A request body holds JSON and at most a base64 video: 4/3 of the video cap, plus the text.
BODY_OVERHEAD_BYTES = 2**20


def default_db_path() -> Path:
    """``$XDG_DATA_HOME/vidsight/serve.db`` (``~/.local/share`` when unset)."""
    root = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(root) / "vidsight" / "serve.db"


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """How the server runs.

    Attributes:
        model: Hugging Face id or checkpoint directory, loaded once for every request and stream.
        device: Where the model runs (None: CUDA when available).
        api_key: Required as ``Authorization: Bearer KEY`` on every ``/v1`` call (None: open).
        allowed_local_media_path: Local videos (paths, ``file://``) must lie under it, links
            resolved; None refuses every local path, as vLLM does.
        db: Where watches, verdicts and alerts live: a SQLite file, or a database URL
            (``postgresql://user@host/name``) that several servers share.
        max_video_bytes: Largest video accepted, uploaded (base64) or fetched.
        fetch_timeout_s: Longest an ``http(s)`` video may take to arrive.
        max_concurrent: Requests admitted at once (queued or running); more get 429.
        model_name: The id ``/v1/models`` lists and requests name (default: the model's).
    """

    model: str
    device: str | None = None
    api_key: str | None = None
    allowed_local_media_path: Path | None = None
    db: str | Path = dataclasses.field(default_factory=default_db_path)
    max_video_bytes: int = DEFAULT_MAX_VIDEO_BYTES
    fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    model_name: str | None = None

    def __post_init__(self):
        if self.max_video_bytes < 1:
            raise ConfigError(f"max_video_bytes must be positive, got {self.max_video_bytes}")
        if not self.fetch_timeout_s > 0:
            raise ConfigError(f"fetch_timeout_s must be positive, got {self.fetch_timeout_s}")
        if self.max_concurrent < 1:
            raise ConfigError(f"max_concurrent must be at least 1, got {self.max_concurrent}")
        if self.allowed_local_media_path is not None and not Path(self.allowed_local_media_path).is_dir():
            raise ConfigError(f"{self.allowed_local_media_path}: --allowed-local-media-path is not a directory")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("the API key is empty")

    @property
    def served_name(self) -> str:
        return self.model_name or str(self.model)

    @property
    def max_body_bytes(self) -> int:
        return self.max_video_bytes * 4 // 3 + BODY_OVERHEAD_BYTES
