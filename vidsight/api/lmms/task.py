"""A generated suite as a local lmms-eval task, scored as `vidsight bench accuracy` scores it.

`write_task` writes a task folder (YAML, the JSONL of documents, a ``utils.py`` lmms-eval loads
the document functions from) that ``lmms-eval --include_path`` reads; the functions below are
what its YAML names.
"""

from __future__ import annotations

import json
from pathlib import Path

from vidsight.bench.accuracy import ANSWER_TOKENS, normalise
from vidsight.bench.suite import build_suite
from vidsight.tasks.families import answer_choices

# A task's YAML: what every task of a suite says, then how it is answered and scored.
TASK_YAML = """\
# Written by `vidsight bench lmms-task{flag}`: the {suite} suite's clips (generated, with known answers).
task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {documents}
test_split: test
doc_to_visual: !function utils.doc_to_visual
doc_to_text: !function utils.doc_to_text
doc_to_target: answer
{answering}metadata:
  - version: 1.0
"""
GENERATED = """\
output_type: generate_until
generation_kwargs:
  max_new_tokens: {answer_tokens}
  temperature: 0
  do_sample: false
process_results: !function utils.process_results
metric_list:
  - metric: accuracy
    aggregation: mean
    higher_is_better: true
"""
# The same clips as a multiple-choice task: lmms-eval ranks each question's choices (`answer_choices`)
# by the model's likelihood of them as the answer instead of reading a generated answer.
MULTIPLE_CHOICE = """\
output_type: multiple_choice
doc_to_choice: !function utils.doc_to_choice
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
TASK_UTILS = ("from vidsight.api.lmms.task import doc_to_choice, doc_to_text, doc_to_visual, process_results  "
              "# noqa: F401\n")


def task_name(suite: str, split: str = "validation", multiple_choice: bool = False) -> str:
    return f"vidsight_{suite}" + ("" if split == "validation" else f"_{split}") + ("_mc" if multiple_choice else "")


def write_task(suite: str, root: str | Path, out: str | Path, progress: bool = False,
               split: str = "validation", multiple_choice: bool = False) -> tuple[Path, float]:
    """Build ``split`` of suite ``suite`` under ``root`` if missing and write its clips as a task under
    ``out``: answered by generating, or with ``multiple_choice`` by ranking each question's choices.

    Returns:
        The task folder (for ``--include_path``) and the suite's sampling rate, which the model
        must sample at (``fps=...``) to see what `vidsight bench accuracy` sees.
    """
    manifest_path = build_suite(suite, root, progress=progress, split=split)
    manifest = json.loads(manifest_path.read_text())
    videos = manifest_path.parent.resolve()
    name = task_name(suite, split, multiple_choice)
    folder = Path(out) / name
    folder.mkdir(parents=True, exist_ok=True)
    documents = folder / "documents.jsonl"
    with documents.open("w") as lines:
        for number, clip in enumerate(manifest["clips"]):
            lines.write(json.dumps({"id": number, "family": clip["family"], "video": str(videos / clip["video"]),
                                    "question": clip["question"], "answer": clip["answer"]}) + "\n")
    answering = MULTIPLE_CHOICE if multiple_choice else GENERATED.format(answer_tokens=ANSWER_TOKENS)
    (folder / f"{name}.yaml").write_text(TASK_YAML.format(
        flag=" --multiple-choice" if multiple_choice else "", suite=f"{suite} ({split} split)", task=name,
        documents=json.dumps(str(documents.resolve())), answering=answering))
    (folder / "utils.py").write_text(TASK_UTILS)
    return folder, manifest["sample_fps"]


def doc_to_visual(doc: dict) -> list[str]:
    return [doc["video"]]


def doc_to_text(doc: dict, lmms_eval_specific_kwargs: dict | None = None) -> str:
    return doc["question"]


def doc_to_choice(doc: dict) -> list[str]:
    return answer_choices(doc["question"])


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """Right when the answer's first word is the expected one (`vidsight.bench.accuracy.normalise`)."""
    return {"accuracy": float(normalise(results[0]) == normalise(doc["answer"]))}
