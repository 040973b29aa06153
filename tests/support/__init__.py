"""Reusable test bed: a local stand-in Hub and LoRA fixtures made during the tests."""
