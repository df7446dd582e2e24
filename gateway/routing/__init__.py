"""Backend registry, load signals, filters, scorers and picker."""

__all__: list[str] = []
