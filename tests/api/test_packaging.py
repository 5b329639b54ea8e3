"""The wheel, installed into a clean virtual environment with the base dependencies only."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from vidsight.api.extras import extra_packages, require_extra
from vidsight.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SERVER_STACK = ("fastapi", "uvicorn", "sqlalchemy", "psycopg", "ray", "selenium", "lmms-eval", "datasets")


def _run(command, **kwargs):
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=600, **kwargs)


def _build_wheel(tmp_path: Path) -> Path:
    # Built from a copy: an in-tree build would leave build/ in the checkout.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "vidsight", source / "vidsight", ignore=shutil.ignore_patterns("__pycache__"))
    built = _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                  "-w", tmp_path / "wheels", source])
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheels").glob("vidsight-*.whl")
    return wheel


def test_wheel_runs_demo_and_probe_with_base_dependencies_only(tmp_path):
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "vidsight/assets/tasks-qwen2.5-vl/model.safetensors" in names
    assert "[lmms_eval.models]" in entry_points and "vidsight.api.lmms:manifest" in entry_points

    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", venv]).returncode == 0
    python, vidsight = venv / "bin" / "python", venv / "bin" / "vidsight"
    # The lock's versions, from pip's cache: the test checks what gets installed, not the network
    # (nor byte-compiling torch's thousands of modules).
    installed = _run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
                      "-c", ROOT / "constraints.txt", wheel])
    assert installed.returncode == 0, installed.stderr
    listed = _run([python, "-m", "pip", "list", "--format", "json"])
    packages = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert {"torch", "transformers", "av"} <= packages
    assert not packages & set(SERVER_STACK), packages & set(SERVER_STACK)

    demo = _run([vidsight, "demo", "--out", tmp_path / "demo", "--json"], cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    report = json.loads(demo.stdout)
    assert report["correct"] is True
    probe = _run([vidsight, "probe", report["video"], "--json"], cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout)["codec"] == "h264"

    # A command that needs an extra exits 2 naming it, with no traceback.
    serve = _run([python, "-m", "vidsight", "serve"], cwd=tmp_path)
    assert serve.returncode == 2
    assert "pip install 'vidsight[serve]'" in serve.stderr and "Traceback" not in serve.stderr
    assert set(extra_packages("serve")) >= {"fastapi", "sqlalchemy"}


def test_a_missing_extra_package_is_named_with_the_install_command(monkeypatch):
    assert {"ray", "fastapi"} <= set(extra_packages("ray"))   # ray names vidsight[serve]
    assert "lmms-eval" not in extra_packages("eval") and "loguru" in extra_packages("eval")
    require_extra("serve", "vidsight serve")   # installed here: nothing raised
    real_version = importlib.metadata.version

    def version(name):
        if name == "fastapi":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    with pytest.raises(ConfigError, match=r"vidsight serve needs the serve extra \(fastapi not installed\): "
                                          r"pip install 'vidsight\[serve\]'"):
        require_extra("serve", "vidsight serve")
