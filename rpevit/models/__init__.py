"""The model: `build_model(cfg, ...)` (factory.py) builds the ViT (vit.py) whose layers come from the registry.

`rpevit.models.vit` (and timm with it) is imported when the first model is built, not with this
package: the task modules import it, and validation imports the task modules for their declarations.
"""
from rpevit.models.factory import build_attention, build_encodings, build_model

__all__ = ["build_attention", "build_encodings", "build_model"]
