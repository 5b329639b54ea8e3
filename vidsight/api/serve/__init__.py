"""`vidsight serve`: one model behind an OpenAI-compatible video API, watches and a dashboard."""

from vidsight._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "vidsight.api.serve.app": ("create_app",),
    "vidsight.api.serve.config": ("ServeConfig",),
})
