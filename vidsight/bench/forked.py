"""Stage processes forked from one that imported torch, transformers and vidsight once.

Each stage of the device check runs as a process of its own (a hang or a crash costs one stage),
and each used to spend 5-8 s importing the same libraries before its first line of work: most of
the dry run, and half a minute of a GPU lease. A `StageForker` starts one Python process that
imports them, then forks it once per stage: the child starts with everything imported, runs
``python -m MODULE ARGS`` as that command would, and exits; the forker's process never computes,
so no thread pool or CUDA context is copied into a child.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

# What the check's commands import before their first line of work: the command line, pytest, and
# transformers' model code for the Qwen2.5-VL family every bench stage loads (others load in the child).
PRELOAD = ("vidsight.api.cli", "vidsight.api.bench", "vidsight.models", "vidsight.engine.chat", "pytest",
           "transformers.modeling_utils", "transformers.models.auto.modeling_auto",
           "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "transformers.models.qwen2.tokenization_qwen2")


class StageForker:
    """A process holding the imports that forks one child per `run` (a context manager).

    Should the imports have touched CUDA in a way a forked child cannot use (no import here
    does so today, and no GPU is at hand where this is written), its first child finds out and
    every stage runs as a fresh process instead (`forks` is then False): slower, never broken.
    """

    def __init__(self, cwd: Path, preload: tuple[str, ...] = PRELOAD):
        self._cwd, self._preload = cwd, preload
        self._start()

    def _start(self) -> None:
        self._server = subprocess.Popen([sys.executable, "-c", "import sys; from vidsight.bench.forked import serve; "
                                         "serve(sys.argv[1:])", *self._preload],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=self._cwd, text=True)
        ready = self._server.stdout.readline()
        self.forks = bool(ready) and json.loads(ready)["cuda_after_fork"]
        if not self.forks:
            self.__exit__()

    def __enter__(self) -> StageForker:
        return self

    def __exit__(self, *exc) -> None:
        self._server.stdin.close()   # the forker exits at the end of its input
        try:
            self._server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._server.kill()

    def run(self, args: tuple[str, ...], env: dict, cwd: Path, timeout_s: float, stdout: Path,
            stderr: Path) -> int | None:
        """``python *args`` (``-m MODULE ...``) with ``env`` added, output to the two files; returns
        its exit status, or None when it ran past ``timeout_s`` and was killed."""
        if args[0] != "-m":
            raise ValueError(f"a forked stage runs a module (-m), got {args[0]!r}")
        if not self.forks:
            return run_in_subprocess(args, env, cwd, timeout_s, stdout, stderr)
        if self._server.poll() is not None:   # an earlier stage took it down: the next starts afresh
            self._start()
            return self.run(args, env, cwd, timeout_s, stdout, stderr)
        request = {"module": args[1], "argv": list(args[2:]), "env": env, "cwd": str(cwd),
                   "timeout_s": timeout_s, "stdout": str(stdout), "stderr": str(stderr)}
        try:
            self._server.stdin.write(json.dumps(request) + "\n")
            self._server.stdin.flush()
            answer = self._server.stdout.readline()
        except OSError:
            answer = ""
        if not answer:
            raise RuntimeError(f"the stage forker stopped (exit {self._server.wait()})")
        return json.loads(answer)["status"]


def run_in_subprocess(args: tuple[str, ...], env: dict, cwd: Path, timeout_s: float, stdout: Path,
                      stderr: Path) -> int | None:
    """`StageForker.run` without the forker: ``python *args`` as a fresh process."""
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        try:
            return subprocess.run([sys.executable, *args], env={**os.environ, **env}, cwd=cwd, stdout=out, stderr=err,
                                  stdin=subprocess.DEVNULL, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            return None


def _cuda_after_fork() -> bool:
    """Whether a child forked now can use CUDA (True where there is none: nothing to lose)."""
    child = os.fork()
    if child == 0:
        code = 1
        try:
            import torch

            if torch.cuda.is_available():
                torch.zeros(1, device="cuda").add_(1).cpu()
            code = 0
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0


def serve(preload: list[str]) -> None:
    """The forker's loop: import ``preload``, then one child per request line, one at a time.

    The libraries are quieted first, as `vidsight` quiets them before transformers reads its
    verbosity at import; so the pytest stages' transformers logs only errors too."""
    from vidsight._libraries import quiet_libraries

    # Answers go on a channel of their own: whatever an import prints goes to stderr, not into them.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    quiet_libraries()
    for module in preload:
        try:
            __import__(module)
        except ImportError:   # another transformers lays its modules out otherwise: the child imports them
            pass
    answers.write(json.dumps({"cuda_after_fork": _cuda_after_fork()}) + "\n")
    answers.flush()
    for line in sys.stdin:
        request = json.loads(line)
        child = os.fork()
        if child == 0:
            _run_child(request)
        answers.write(json.dumps({"status": _wait(child, request["timeout_s"])}) + "\n")
        answers.flush()


def _wait(child: int, timeout_s: float) -> int | None:
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            return None
        time.sleep(0.05)


def _run_child(request: dict) -> None:
    """Become ``python -m MODULE ARGV`` and exit with its status; never returns."""
    code = 1
    try:
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.path.insert(0, request["cwd"])   # as `python -m` puts the working directory first
        # The forker's own ends of its pipes (requests in, answers out) are replaced, not shared.
        for fd, name, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            target = os.open(name, flags, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.argv = [request["module"], *request["argv"]]
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)
