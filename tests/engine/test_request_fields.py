"""The request's field declarations: one map by name (`DECLARED_FIELDS`), and bounds read as declared."""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest

from engine import request_fields, video_references
from engine.request_fields import DECLARED_FIELDS, REQUEST_FIELDS
from engine.request_schema import RequestField
from engine.requests import DECLARED_FIELDS as REEXPORTED


def test_the_map_holds_each_declaration_once_by_its_name_and_is_read_only():
    assert list(DECLARED_FIELDS) == [f.name for f in REQUEST_FIELDS]
    assert all(DECLARED_FIELDS[f.name] is f for f in REQUEST_FIELDS)
    assert REEXPORTED is DECLARED_FIELDS  # engine.requests re-exports it: no second map
    with pytest.raises(TypeError):
        DECLARED_FIELDS["steps"] = DECLARED_FIELDS["seed"]  # type: ignore[index]


def test_bounds_are_read_as_declared_a_zero_included():
    assert DECLARED_FIELDS["reference_strength"].bounds() == (0, 1)
    assert DECLARED_FIELDS["reference_downscale"].bounds() == (1, 8)
    # A 0 high bound is a bound: an `or` fallback would have turned it into its default.
    assert RequestField("number", "a number from -1 to 0", "a test", low=-1, high=0, name="x").bounds() == (-1, 0)


def test_a_missing_bound_is_refused_by_name():
    with pytest.raises(ValueError, match="request field 'steps' declares no high bound"):
        DECLARED_FIELDS["steps"].bounds()
    with pytest.raises(ValueError, match="request field 'prompt' declares no low bound"):
        DECLARED_FIELDS["prompt"].bounds()


def test_a_check_reading_bounds_fails_at_import_when_its_field_declares_none(monkeypatch):
    """`engine.video_references` reads the in-context settings' bounds at import: a declaration without them stops
    the import rather than letting the check run against a bound nobody declared."""
    unbounded = replace(DECLARED_FIELDS["reference_strength"], high=None)
    monkeypatch.setattr(request_fields, "DECLARED_FIELDS", {**DECLARED_FIELDS, "reference_strength": unbounded})
    monkeypatch.setattr("engine.requests.DECLARED_FIELDS", request_fields.DECLARED_FIELDS)
    try:
        with pytest.raises(ValueError, match="request field 'reference_strength' declares no high bound"):
            importlib.reload(video_references)
    finally:
        monkeypatch.undo()
        importlib.reload(video_references)
