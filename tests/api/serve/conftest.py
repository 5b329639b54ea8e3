"""Servers over the tiny model for the API tests, on either backend: one process (uvicorn in a
thread) or Ray Serve (a local Ray instance on 127.0.0.1 with two replicas); and a media directory."""

import contextlib

import pytest

from vidsight.api.serve import ServeConfig, create_app
from vidsight.api.serve.background import serve_in_background

QUERY = "Is there a red object in the zone? Answer Yes or No."
# Tests on Ray take a replica for dead after this long without a heartbeat (the default is 10 s).
RAY_REPLICA_TIMEOUT_S = 3.0


@pytest.fixture(scope="session")
def media(tmp_path_factory, make_test_video):
    """An allowed media directory holding two short videos."""
    root = tmp_path_factory.mktemp("media")
    for name, seed in (("clip.mp4", 1), ("other.mp4", 2)):
        path, _ = make_test_video(width=160, height=120, fps=8, duration_s=3.0, gop=8, bframes=False, seed=seed)
        (root / name).write_bytes(path.read_bytes())
    return root


def _media_video(media, make_test_video, name: str, duration_s: float, seed: int):
    path, _ = make_test_video(width=160, height=120, fps=8, duration_s=duration_s, gop=16, bframes=False, seed=seed)
    target = media / name
    target.write_bytes(path.read_bytes())
    return target


@pytest.fixture(scope="session")
def long_video(media, make_test_video):
    return _media_video(media, make_test_video, "long.mp4", 24.0, seed=5)


@pytest.fixture(scope="session")
def twelve_second_video(media, make_test_video):
    """Long enough for a real-time watch to be stopped or killed after three windows and resumed."""
    return _media_video(media, make_test_video, "twelve.mp4", 12.0, seed=7)


@pytest.fixture
def scratch(request, tmp_path, monkeypatch):
    """Temporary files go here, so a test can see none is left: this process's, or under Ray the
    replicas' (their TMPDIR, `ray_tmp`), where the requests are served."""
    import tempfile

    params = getattr(request.node, "callspec", None)
    if params is not None and params.params.get("make_server") == "ray":
        root = request.getfixturevalue("ray_tmp")
        assert not list(root.iterdir()), "an earlier Ray test left temporary files"
        return root
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture(scope="session")
def ray_tmp(tmp_path_factory):
    """The Ray replicas' temporary directory (their TMPDIR)."""
    return tmp_path_factory.mktemp("ray-tmp")


@pytest.fixture
def make_local_server(tiny_adapter, media, tmp_path):
    """Starts single-process servers over the tiny model with the given settings (one database per
    test); yields ``(url, server)``, the `Server` inside."""

    @contextlib.contextmanager
    def make(**settings):
        fields = {"model": "tiny", "allowed_local_media_path": media, "db": tmp_path / "serve.db", **settings}
        app = create_app(ServeConfig(**fields), adapter=tiny_adapter)
        with serve_in_background(app) as url:
            yield url, app.state.server

    return make


@pytest.fixture(scope="session")
def ray_serve(ray_tmp):
    """Ray and Ray Serve on this machine, HTTP on a free loopback port; yields its URL and the
    deployments made so far (settings -> route prefix)."""
    import ray
    from ray import serve

    from vidsight.api.serve.ray_cli import start_serve_on_a_free_port

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False, runtime_env={"env_vars": {"TMPDIR": str(ray_tmp)}})
    port = start_serve_on_a_free_port()
    yield f"http://127.0.0.1:{port}", {}
    serve.shutdown()
    ray.shutdown()


@pytest.fixture
def make_ray_server(ray_serve, tiny_model_dir, media, tmp_path_factory):
    """The app on Ray Serve with two replicas of the tiny model, one deployment per distinct
    settings, each under a route prefix of its own and kept for the session (a deployment takes
    seconds); yields ``(url, None)``. Replicas reserve no CPU, so the deployments fit side by side."""
    from ray import serve

    from vidsight.api.serve.config import RayConfig
    from vidsight.api.serve.ray_app import build_app

    url, deployed = ray_serve

    @contextlib.contextmanager
    def make(**settings):
        key = tuple(sorted((k, str(v)) for k, v in settings.items()))
        if key not in deployed:
            name = f"vidsight{len(deployed)}"
            fields = {"model": str(tiny_model_dir), "model_name": "tiny", "device": "cpu",
                      "allowed_local_media_path": media, "db": tmp_path_factory.mktemp("ray") / "serve.db",
                      **settings}
            serve.run(build_app(ServeConfig(**fields), RayConfig(replicas=2, replica_cpus=0,
                                                                replica_timeout_s=RAY_REPLICA_TIMEOUT_S)),
                      name=name, route_prefix=f"/{name}")
            deployed[key] = f"{url}/{name}"
        yield deployed[key], None

    return make


@pytest.fixture(params=["local", "ray"])
def make_server(request):
    """The API tests run against both backends: ``make_server(**settings)`` yields ``(url, server)``,
    ``server`` being the in-process `Server` (None on Ray)."""
    return request.getfixturevalue(f"make_{request.param}_server")
