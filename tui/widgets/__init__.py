"""One widget per module, each with its own DEFAULT_CSS."""
