"""The demo: a generated video with a known answer, asked of vidsight's own trained model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from vidsight.bench.accuracy import normalise
from vidsight.bench.suite import VIDEO_FPS
from vidsight.tasks.families import SAMPLE_FPS, make_sample
from vidsight.engine import Asker, GenerationConfig
from vidsight.ingest import SamplingConfig, decode_frames, probe, sample_frames
from vidsight.ingest.writer import write_video
from vidsight.models import TASK_MODEL
from vidsight.train.recipe import TRAINING_RECORD

SHEET_COLUMNS = 8
SHEET_SCALE = 2


def contact_sheet(frames: np.ndarray, times_s: np.ndarray, path: Path) -> Path:
    """A grid of the sampled frames, each labelled with its time, for a person to check the answer."""
    t, h, w, _ = frames.shape
    rows = -(-t // SHEET_COLUMNS)
    cell_h, cell_w = h * SHEET_SCALE + 14, w * SHEET_SCALE
    sheet = Image.new("RGB", (SHEET_COLUMNS * cell_w, rows * cell_h), "white")
    draw = ImageDraw.Draw(sheet)
    for i, (frame, time_s) in enumerate(zip(frames, times_s)):
        x, y = (i % SHEET_COLUMNS) * cell_w, (i // SHEET_COLUMNS) * cell_h
        sheet.paste(Image.fromarray(frame).resize((cell_w, h * SHEET_SCALE), Image.NEAREST), (x, y))
        draw.text((x + 2, y + h * SHEET_SCALE + 1), f"{time_s:.1f} s", fill="black")
    sheet.save(path)
    return path


def run_demo(out: str | Path, family: str = "needle", seed: int = 7, model: str | Path = TASK_MODEL,
             as_json: bool = False) -> int:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sample = make_sample(family, seed)
    times = np.arange(int(sample.frames / SAMPLE_FPS * VIDEO_FPS)) / VIDEO_FPS
    video = write_video(out / f"{family}_{seed}.mp4", (sample.scene.render(t) for t in times), times, VIDEO_FPS, gop=8)
    (out / f"{family}_{seed}.json").write_text(json.dumps(
        {"question": sample.question, "answer": sample.answer, "scene": sample.scene.to_dict()}, indent=1))
    result = Asker(model).ask(video, sample.question, sampling=SamplingConfig(fps=SAMPLE_FPS),
                              generation=GenerationConfig(max_new_tokens=8), progress=sys.stderr.isatty() and not as_json)
    info = probe(video)
    frames = decode_frames(video, sample_frames(info, SamplingConfig(fps=SAMPLE_FPS)), info=info)
    sheet = contact_sheet(frames.data.numpy(), frames.pts_s.numpy(), out / f"{family}_{seed}_frames.png")
    correct = normalise(result.answer) == normalise(sample.answer)
    if as_json:
        print(json.dumps({"video": str(video), "contact_sheet": str(sheet), "model": str(model),
                          "question": sample.question, "truth": sample.answer, "correct": correct, **result.to_dict()}))
        return 0
    s = result.stats
    record = Path(model) / TRAINING_RECORD
    if record.exists():
        trained = json.loads(record.read_text())
        accuracy = trained["held_out_accuracy"] or {}
        if min(accuracy.values(), default=0) < 0.9:
            scores = ", ".join(f"{k} {v:.0%}" for k, v in accuracy.items())
            print(f"NOTE: this model's held-out accuracy is {scores} after {trained['steps_trained']} training "
                  f"steps; below 90 % its answers are partly guesses.")
    print(f"video:         {video} ({sample.frames / SAMPLE_FPS:.0f} s, generated; the scene is in the .json beside it)")
    print(f"contact sheet: {sheet} (the {s.frames} frames the model saw)")
    print(f"model:         {model}")
    print(f"question:      {sample.question}")
    print(f"answer:        {result.answer}")
    print(f"ground truth:  {sample.answer}  ({'correct' if correct else 'wrong'})")
    print(f"frames {s.frames}, visual tokens {s.visual_tokens}, prompt tokens {s.prompt_tokens}, "
          f"generated {s.generated_tokens}; " + ", ".join(f"{k} {v:.3f} s" for k, v in s.stages_s.items()))
    return 0
