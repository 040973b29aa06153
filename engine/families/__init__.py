"""Base-model families: how each is loaded, recognised and served."""
