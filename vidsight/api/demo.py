"""The demo: a generated video, a tiny random model, and `ask` end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vidsight.engine import Asker, GenerationConfig
from vidsight.ingest import SyntheticSpec, make_video
from vidsight.models import write_tiny_model

NOTICE = ("NOTE: the demo model has random weights, so its answer is noise. The demo shows the machinery:\n"
          "decode, preprocessing, vision encoder, prefill and generation, with the time each took.")


def run_demo(out: str | Path, as_json: bool = False) -> int:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    video = out / "moving_square.mp4"
    make_video(video, SyntheticSpec(width=640, height=360, fps=24, duration_s=10, gop=16, bframes=True))
    model_dir = out / "tiny-qwen2.5-vl"
    if not (model_dir / "config.json").exists():
        write_tiny_model(model_dir)
    question = "What colour is the moving square?"
    result = Asker(str(model_dir)).ask(video, question, generation=GenerationConfig(max_new_tokens=16),
                                       progress=sys.stderr.isatty() and not as_json)
    if as_json:
        print(json.dumps({"video": str(video), "model": str(model_dir), "question": question, **result.to_dict()}))
        return 0
    s = result.stats
    print(NOTICE)
    print(f"video:    {video} (10 s, 640x360, a red square moving over a textured background)")
    print(f"model:    {model_dir} (random weights)")
    print(f"question: {question}")
    print(f"answer:   {result.answer!r}")
    print(f"frames {s.frames}, visual tokens {s.visual_tokens}, prompt tokens {s.prompt_tokens}, "
          f"generated {s.generated_tokens}")
    for stage, seconds in s.stages_s.items():
        print(f"  {stage:<10} {seconds:7.3f} s")
    print(f"peak memory {s.peak_memory_bytes / 2**20:.0f} MiB on {s.device}")
    return 0
