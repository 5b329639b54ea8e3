"""`probe`, `--help` and flag errors never import torch or transformers (they cost seconds)."""

import subprocess
import sys

import pytest

CHECK = """
import sys
from vidsight.api.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print("HEAVY", ",".join(heavy) or "none", "EXIT", code, file=sys.stderr)
"""


def run(*args):
    done = subprocess.run([sys.executable, "-c", CHECK, *args], capture_output=True, text=True, timeout=120)
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("args", [("--help",), ("ask", "--help"), ("ask", "v.mp4", "q", "--rho", "abc"),
                                  ("watch", "--bogus"), ("probe", "/no/such/file.mp4"), ("serve", "--help"),
                                  ("serve", "--port", "x")])
def test_help_flag_errors_and_probe_errors_stay_light(args):
    assert run(*args).startswith("HEAVY none EXIT ")


def test_version_names_the_libraries_without_importing_them():
    import importlib.metadata

    import av

    assert run("--version") == "HEAVY none EXIT 0"
    shown = subprocess.run([sys.executable, "-m", "vidsight.api.cli", "--version"], capture_output=True, text=True,
                           timeout=120).stdout
    for name, version in (("vidsight", importlib.metadata.version("vidsight")),
                          ("torch", importlib.metadata.version("torch")), ("PyAV", av.__version__),
                          ("transformers", importlib.metadata.version("transformers")),
                          ("FFmpeg", av.ffmpeg_version_info)):
        assert f"{name} {version}" in shown


def test_probe_stays_light(make_test_video):
    path, _ = make_test_video(duration_s=1.0)
    assert run("probe", str(path), "--json") == "HEAVY none EXIT 0"
