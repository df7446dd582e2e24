"""owngate: an OpenAI-compatible gateway that routes to your own GPUs first."""

__version__ = "0.1.0"

__all__ = ["__version__"]
