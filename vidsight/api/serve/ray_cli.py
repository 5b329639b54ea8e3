"""Deploys `vidsight serve --ray` and keeps it up until interrupted."""

from __future__ import annotations

import threading

from vidsight.api.extras import require_extra
from vidsight.api.serve.config import RayConfig, ServeConfig

APP_NAME = "vidsight"


def start_serve_on_a_free_port(host: str = "127.0.0.1", attempts: int = 3) -> int:
    """Start Ray Serve (Ray already up) with its HTTP proxy on a free port of ``host``; the port.

    A port found free by binding port 0 can be taken by another process before the proxy binds
    it (a benchmark's or a test's servers beside it), so a proxy that fails to bind is shut down
    and started again on another port.
    """
    import socket

    from ray import serve

    attempt = 1
    while True:
        with socket.socket() as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
        try:
            serve.start(http_options={"host": host, "port": port})
            return port
        except Exception as error:   # Ray wraps the proxy's own error in its task error
            if "Failed to bind" not in str(error) or attempt == attempts:
                raise
            serve.shutdown()
            attempt += 1


def run_on_ray(config: ServeConfig, ray_config: RayConfig, host: str, port: int, debug: bool = False) -> int:
    """Start (or join) Ray, deploy the app with its HTTP proxy on ``host:port``, serve until Ctrl-C."""
    require_extra("ray", "vidsight serve --ray")
    import ray
    from ray import serve

    from vidsight.api.serve.ray_app import build_app

    ray.init(address=ray_config.address or "local", include_dashboard=debug, log_to_driver=debug)
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(build_app(config, ray_config), name=APP_NAME, route_prefix="/")
        print(f"vidsight on Ray Serve at http://{host}:{port} ({ray_config.describe()}); Ctrl-C stops it", flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        serve.delete(APP_NAME)   # replicas stop at a window boundary; their watches stay running in the store
        ray.shutdown()
    return 0
