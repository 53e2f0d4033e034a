"""Attention backends; every module here registers itself (see rpevit.registry)."""
