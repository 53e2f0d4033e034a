"""Position encodings; every module here registers itself (see rpevit.registry)."""
