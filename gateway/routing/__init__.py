"""Where a request may go and in which order: the backend registry, load signals and
health, the filters (`filters/`), scorers (`scorers/`) and load model (`load.py`), the
picker, and the router (`router.py`) whose plan yields each request's attempts and takes
their reports. Routing never imports the HTTP surface (gateway/routing/ruff.toml)."""

__all__: list[str] = []
