"""The fuzz benchmark: damaged and hostile inputs through `vidsight probe`, `ask` and `watch`, and
through `watch -` from a pipe.

Every run must end in exit status 0 (what was valid decoded, losses counted) or 2 (one message
naming the input and the problem): a traceback, another status, a run past the time limit or a
gigabyte of memory is a failure. Each command runs in a child forked from a fresh process that
has imported vidsight, torch and transformers and done nothing else, so a case costs its own work
and not three seconds of imports; the child's peak resident memory (from `wait4`) includes those
libraries, as a real `vidsight` process would, and nothing of the caller's (a test process holding
a gigabyte of models made every case of the suite's sample a "memory" failure when forked from it).
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import io
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from vidsight.bench.damage import Case, make_case, make_sources

TIME_LIMIT_S = 60.0
MEMORY_LIMIT_BYTES = 2**30
QUESTION = "What happens in the video?"
# What each input goes through: the probe alone, `ask`'s decoders, `watch`'s live source, the
# live source reading the input's bytes from a pipe on standard input (a file's only), and the live
# source replayed in real time, read in a thread while the watch keeps up (`--realtime`).
COMMANDS = ("probe", "ask", "watch", "watch-stdin", "watch-live")
STDIN_NAME = "<stdin>"   # what messages call standard input
CLI_MAIN = "vidsight.api.cli:main"
# What `ask` needs, imported by the process the children are forked from.
WARM_IMPORTS = ("transformers", "vidsight.engine.ask", "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl")


@dataclasses.dataclass
class Outcome:
    """How one command ended on one case.

    Attributes:
        case: The input.
        command: One of `COMMANDS`.
        exit_code: The process's exit status (-9 when killed at the time limit).
        verdict: ``exit 0``, ``exit 2``, ``traceback``, ``hang``, ``other exit``, ``memory`` (over
            `MEMORY_LIMIT_BYTES`) or ``unnamed`` (exit 2 without naming the input).
        seconds: Wall time of the command.
        peak_rss_bytes: The process's peak resident memory.
        message: The last line the command wrote to stderr.
    """

    case: Case
    command: str
    exit_code: int
    verdict: str
    seconds: float
    peak_rss_bytes: int
    message: str

    @property
    def failed(self) -> bool:
        return self.verdict not in ("exit 0", "exit 2")


def command_line(command: str, path: str, model: str) -> list[str]:
    if command == "probe":
        return ["probe", path, "--json"]
    if command.startswith("watch"):
        return ["watch", "-" if command == "watch-stdin" else path, "--query", QUESTION, "--model", model,
                "--window", "1", "--json", *(["--realtime"] if command == "watch-live" else [])]
    return ["ask", path, QUESTION, "--model", model, "--max-new-tokens", "4", "--fps", "4", "--json"]


def run_fuzz(cases: int, seed: int, model: str | Path, root: str | Path | None = None, workers: int = 2,
             commands: tuple[str, ...] = COMMANDS, time_limit_s: float = TIME_LIMIT_S,
             progress: bool = False, main: str = CLI_MAIN) -> list[Outcome]:
    """Make ``cases`` inputs from ``seed`` and run each command on each, ``workers`` at a time.

    Args:
        cases: Inputs to make.
        seed: Seeds which damage, where and how much: the same seed makes the same inputs.
        model: The checkpoint `ask` and `watch` load (a small one keeps the run about damage, not compute).
        root: Where inputs go (default: a temporary directory, removed afterwards).
        workers: Commands running at once.
        commands: Which of `COMMANDS` to run.
        time_limit_s: A command still running after this long is killed and counted as a hang.
        progress: Show a progress bar.
        main: ``module:function``, the command line's entry point each child runs (the fresh
            process imports it, so it must be importable there: on ``PYTHONPATH``).

    Returns:
        One outcome per case and command, in the order made.
    """
    with tempfile.TemporaryDirectory(prefix="vidsight-fuzz-") as scratch:
        base = Path(root) if root is not None else Path(scratch)
        sources = make_sources(base / "sources")
        inputs = base / f"seed-{seed}"
        inputs.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(seed)
        made = [make_case(k, inputs, sources, rng) for k in range(cases)]
        jobs = [(case, command) for case in made for command in commands
                if (command != "watch-stdin" or pipeable(case.path))
                and (command != "watch-live" or replayable(case.path, time_limit_s))]
        request = {"main": main, "workers": workers, "time_limit_s": time_limit_s, "progress": progress,
                   "jobs": [{"argv": command_line(command, case.path, str(model)),
                             "stdin": case.path if command == "watch-stdin" else None,
                             "log": str(Path(scratch) / f"{case.name}-{command}.log")} for case, command in jobs]}
        ran = subprocess.run([sys.executable, "-c", "from vidsight.bench.fuzz import serve_fuzz; serve_fuzz()"],
                             input=json.dumps(request), stdout=subprocess.PIPE, text=True)
        if ran.returncode != 0:
            raise RuntimeError(f"the fuzz runner exited {ran.returncode} before reporting (its stderr is above)")
        return [_outcome(case, command, ended) for (case, command), ended in zip(jobs, json.loads(ran.stdout))]


def replayable(path: str, time_limit_s: float) -> bool:
    """Whether a real-time replay of ``path`` can end within half the time limit: a file whose
    damaged header stretches its timestamps (a frame every 45 minutes) is replayed as slowly as it
    says, as FFmpeg's ``-re`` would, so it is no hang; one that cannot be probed fails at once."""
    from vidsight.errors import VidsightError
    from vidsight.ingest import probe

    try:
        duration_s = probe(path).duration_s
    except (VidsightError, OSError):
        return True
    return duration_s is None or duration_s <= time_limit_s / 2


def pipeable(path: str) -> bool:
    """Whether a shell could pipe ``path`` in: a regular file (not a directory, a FIFO, a missing
    file or a name too long to exist)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def serve_fuzz() -> None:
    """The fresh process `run_fuzz` starts: the request on stdin, per job how it ended on stdout."""
    # The report goes on a channel of its own: whatever an import prints goes to stderr, not into it.
    report = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    request = json.load(sys.stdin)
    module, function = request["main"].split(":")
    main = getattr(importlib.import_module(module), function)
    for name in WARM_IMPORTS:   # no torch work: forked OpenMP is unsafe
        importlib.import_module(name)
    jobs = collections.deque(enumerate(request["jobs"]))
    running: dict[int, tuple[int, float, str]] = {}
    ended: dict[int, dict] = {}
    with tqdm(total=len(jobs), desc="fuzz", unit="run", disable=not request["progress"]) as bar:
        while jobs or running:
            while jobs and len(running) < request["workers"]:
                index, job = jobs.popleft()
                pid = os.fork()
                if pid == 0:
                    _child(main, job["argv"], job["log"], job["stdin"])
                running[pid] = (index, time.monotonic(), job["log"])
            ended.update(_reap(running, request["time_limit_s"]))
            bar.update(len(ended) - bar.n)
    json.dump([ended[index] for index in range(len(ended))], report)
    report.close()


def _child(main: Callable[[list[str]], int], argv: list[str], log_path: str, stdin_path: str | None) -> None:
    """Runs in the forked child: the command line as ``main`` (`vidsight`'s) runs it, output to
    ``log_path``, standard input a pipe that ``stdin_path``'s bytes are written into (else none)."""
    import logging
    import traceback

    import torch

    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    # A fresh process's streams and logging.
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    if stdin_path is not None:
        sys.stdin = _piped(stdin_path)
    logging.root.handlers.clear()
    torch.set_num_threads(1)  # cases run side by side, one per core
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # what the interpreter would print for an uncaught exception
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def pipe_of(path: str | Path) -> int:
    """The reading end (a descriptor) of a pipe that a thread fills with ``path``'s bytes, as
    ``cat path |`` fills a pipeline's."""
    read_end, write_end = os.pipe()

    def feed():
        with open(path, "rb") as source, os.fdopen(write_end, "wb") as out:
            try:
                shutil.copyfileobj(source, out)
            except BrokenPipeError:   # the reader stopped reading
                pass

    threading.Thread(target=feed, daemon=True).start()
    return read_end


def _piped(path: str) -> io.TextIOWrapper:
    """Standard input as a shell pipeline makes it: `pipe_of` ``path`` on descriptor 0, named as
    the interpreter names standard input."""
    read_end = pipe_of(path)
    os.dup2(read_end, 0)
    os.close(read_end)
    raw = io.FileIO(0, "rb", closefd=False)
    raw.name = STDIN_NAME
    return io.TextIOWrapper(io.BufferedReader(raw))


def _reap(running: dict[int, tuple[int, float, str]], time_limit_s: float) -> dict[int, dict]:
    """Collect the children that ended, killing those past the time limit: per job's index, how it ended."""
    done = {}
    while True:
        pid, status, usage = os.wait4(-1, os.WNOHANG)
        if pid == 0:
            break
        if pid in running:  # not some other child of this process
            done.update(_ended(running.pop(pid), status, usage, timed_out=False))
        if not running:
            break
    now = time.monotonic()
    for pid, (index, started, log_path) in list(running.items()):
        if now - started > time_limit_s:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            done.update(_ended(running.pop(pid), status, usage, timed_out=True))
    if not done:
        time.sleep(0.01)
    return done


def _ended(job: tuple[int, float, str], status: int, usage: resource.struct_rusage, timed_out: bool) -> dict[int, dict]:
    index, started, log_path = job
    log = Path(log_path).read_text(errors="replace") if Path(log_path).exists() else ""
    return {index: {"exit_code": os.waitstatus_to_exitcode(status), "timed_out": timed_out, "log": log,
                    "seconds": time.monotonic() - started, "peak_rss_bytes": usage.ru_maxrss * 1024}}  # Linux: KiB


def _classify(code: int, log: str, name: str, timed_out: bool, peak: int) -> str:
    if timed_out:
        return "hang"
    if "Traceback (most recent call last)" in log:
        return "traceback"
    if code not in (0, 2):
        return "other exit"
    if peak > MEMORY_LIMIT_BYTES:
        return "memory"
    if code == 2 and name not in log:
        return "unnamed"  # a refusal must say which input it refuses
    return f"exit {code}"


def _outcome(case: Case, command: str, ended: dict) -> Outcome:
    code, log, peak = ended["exit_code"], ended["log"], ended["peak_rss_bytes"]
    lines = [line for line in log.splitlines() if line.strip()]
    name = STDIN_NAME if command == "watch-stdin" else case.path
    return Outcome(case, command, code, _classify(code, log, name, ended["timed_out"], peak), ended["seconds"],
                   peak, lines[-1][:300] if lines else "")


def summarise(outcomes: list[Outcome]) -> dict:
    """Counts per damage kind and command, the worst time and memory, and every failure."""
    rows: dict[str, dict] = {}
    for outcome in outcomes:
        row = rows.setdefault(outcome.case.kind, collections.Counter())
        row["runs"] += 1
        row[outcome.verdict] += 1
        row["max_s"] = max(row["max_s"], outcome.seconds)
        row["max_rss_mib"] = max(row["max_rss_mib"], outcome.peak_rss_bytes / 2**20)
    total = collections.Counter(o.verdict for o in outcomes)
    return {
        "runs": len(outcomes),
        "cases": len({o.case.name for o in outcomes}),
        "verdicts": dict(total),
        "max_s": max((o.seconds for o in outcomes), default=0.0),
        "max_rss_mib": max((o.peak_rss_bytes for o in outcomes), default=0) / 2**20,
        "by_kind": {kind: dict(row) for kind, row in sorted(rows.items())},
        "sample_messages": _sample_messages(outcomes),
        "failures": [{"case": o.case.name, "path": o.case.path, "command": o.command, "verdict": o.verdict,
                      "exit_code": o.exit_code, "message": o.message} for o in outcomes if o.failed],
    }


def _sample_messages(outcomes: list[Outcome], per_kind: int = 3) -> dict[str, list[str]]:
    """A few distinct refusals per damage kind, with the case's own name replaced, to read what users see."""
    samples: dict[str, list[str]] = {}
    for outcome in outcomes:
        if outcome.verdict == "exit 2":
            text = outcome.message.replace(outcome.case.path, "INPUT")
            kept = samples.setdefault(outcome.case.kind, [])
            if text not in kept and len(kept) < per_kind:
                kept.append(text)
    return samples


def format_fuzz_report(report: dict) -> str:
    columns = ("exit 0", "exit 2", "traceback", "hang", "other exit", "memory", "unnamed")
    lines = [f"{'damage':<18} {'runs':>5} " + " ".join(f"{c:>10}" for c in columns) + f" {'max s':>7} {'max MiB':>8}"]
    for kind, row in report["by_kind"].items():
        lines.append(f"{kind:<18} {row['runs']:>5} " + " ".join(f"{row.get(c, 0):>10}" for c in columns)
                     + f" {row['max_s']:>7.1f} {row['max_rss_mib']:>8.0f}")
    total = report["verdicts"]
    lines.append(f"{'all':<18} {report['runs']:>5} " + " ".join(f"{total.get(c, 0):>10}" for c in columns)
                 + f" {report['max_s']:>7.1f} {report['max_rss_mib']:>8.0f}")
    for failure in report["failures"][:20]:
        lines.append(f"FAILED {failure['case']} {failure['command']}: {failure['verdict']} "
                     f"(exit {failure['exit_code']}): {failure['message']}")
    return "\n".join(lines)
