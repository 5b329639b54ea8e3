"""A real server on 127.0.0.1 (uvicorn in a thread) over the tiny model, and a media directory."""

import contextlib

import pytest

from vidsight.api.serve import ServeConfig, create_app
from vidsight.api.serve.background import serve_in_background

QUERY = "Is there a red object in the zone? Answer Yes or No."


@pytest.fixture(scope="module")
def media(tmp_path_factory, make_test_video):
    """An allowed media directory holding two short videos."""
    root = tmp_path_factory.mktemp("media")
    for name, seed in (("clip.mp4", 1), ("other.mp4", 2)):
        path, _ = make_test_video(width=160, height=120, fps=8, duration_s=3.0, gop=8, bframes=False, seed=seed)
        (root / name).write_bytes(path.read_bytes())
    return root


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """Temporary files go here, so a test can see none is left."""
    import tempfile

    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture
def make_server(tiny_adapter, media, tmp_path):
    """Starts servers over the tiny model with the given settings (one database per test)."""

    @contextlib.contextmanager
    def make(**settings):
        fields = {"model": "tiny", "allowed_local_media_path": media, "db": tmp_path / "serve.db", **settings}
        app = create_app(ServeConfig(**fields), adapter=tiny_adapter)
        with serve_in_background(app) as url:
            yield url, app.state.server

    return make
