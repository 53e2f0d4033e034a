"""rpevit: relative positional encodings for Vision Transformers, softmax vs Performer attention."""
__version__ = "0.1.0"
