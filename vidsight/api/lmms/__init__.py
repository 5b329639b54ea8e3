"""vidsight as an lmms-eval model: ``lmms-eval --model vidsight --model_args pretrained=...,rho=0.5``.

lmms-eval finds `manifest` through the ``lmms_eval.models`` entry point in pyproject.toml; the
model class loads only when lmms-eval asks for it, so ``import vidsight`` never needs lmms-eval.
"""

from __future__ import annotations

MODEL_NAME = "vidsight"


def manifest():
    """The `ModelManifest` lmms-eval registers ``vidsight`` with."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return ModelManifest(model_id=MODEL_NAME, simple_class_path="vidsight.api.lmms.model.VidsightLMM")
