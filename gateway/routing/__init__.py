"""Backend registry, load signals, filters, scorers and picker."""
