from rpevit.models.vit import ViT, build_model

__all__ = ["ViT", "build_model"]
