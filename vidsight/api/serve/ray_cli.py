"""Deploys `vidsight serve --ray` and keeps it up until interrupted."""

from __future__ import annotations

import threading

from vidsight.api.extras import require_extra
from vidsight.api.serve.config import RayConfig, ServeConfig

APP_NAME = "vidsight"


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
