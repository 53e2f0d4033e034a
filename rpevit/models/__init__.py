from rpevit.models.factory import build_attention, build_encodings, build_model
from rpevit.models.vit import ViT

__all__ = ["ViT", "build_attention", "build_encodings", "build_model"]
