"""Where vidsight's own checkpoints live (no torch here, so the command line can name them)."""

from pathlib import Path

# vidsight's own small model, trained on generated videos (`vidsight train`), shipped in the repository.
TASK_MODEL = Path(__file__).resolve().parents[1] / "assets" / "tasks-qwen2.5-vl"
