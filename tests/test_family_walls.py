"""A family is its own files: nothing outside `families/` and `engine/families/` names or compares a family, and
each family's identity and spec are imported only by its own modules, the registry and the family-generic layers.

Which family a LoRA belongs to is one table of claims (`families.claims`); what pools and the engine need from a
family they read through its spec (`FamilySpec`), so adding a family adds its own files and one `Family` member.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from families import IDENTITIES, Family
from tests.support.fresh import call_fresh
from tests.test_layering import _graph

REPO = Path(__file__).resolve().parent.parent
# The layers that hold no family's facts (`families/` and `engine/families/` hold them).
GENERIC = ("engine", "serving", "lora_catalog")
FAMILY_HOMES = (REPO / "families", REPO / "engine" / "families")
VALUES = {f.value for f in Family if f is not Family.UNKNOWN}
MEMBERS = {f.name for f in Family if f is not Family.UNKNOWN}
# A family built on another's spec (`dataclasses.replace` of it: an editing model on its base's transformer, FLUX.2
# [dev] on klein's), which imports that family's spec module (and its identity module, where the identity too is
# declared by difference: Wan I2V over Wan); the base's files stay untouched by it.
BUILT_ON = {
    Family.FLUX_KONTEXT: (Family.FLUX,),
    Family.QWEN_IMAGE_EDIT: (Family.QWEN_IMAGE,),
    Family.QWEN_IMAGE_EDIT_PLUS: (Family.QWEN_IMAGE_EDIT, Family.QWEN_IMAGE),
    Family.FLUX2_DEV: (Family.FLUX2,),
    Family.WAN_I2V: (Family.WAN,),
    Family.WAN22: (Family.WAN,),
    Family.WAN22_I2V: (Family.WAN22, Family.WAN),
}


def _names_a_family(node: ast.AST) -> bool:
    """`Family.FLUX`, or a family's value as a literal ("flux") or among a literal tuple's."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Family":
        return node.attr in MEMBERS
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in VALUES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_family(e) for e in node.elts)
    return False


def _family_references(source: str) -> list[str]:
    """Each `Family.<member>` and each comparison with a family's value (`family == "flux"`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        compared = isinstance(node, ast.Compare) and any(
            isinstance(side, ast.Constant | ast.Tuple | ast.List | ast.Set) and _names_a_family(side)
            for side in [node.left, *node.comparators]
        )
        if compared or (isinstance(node, ast.Attribute) and _names_a_family(node)):
            found.append(f"{getattr(node, 'lineno', 0)}: {ast.unparse(node)}")
    return found


def test_no_layer_outside_the_families_names_or_compares_a_family():
    sources = [p for root in GENERIC for p in sorted((REPO / root).rglob("*.py"))]
    sources = [p for p in sources if not any(p.is_relative_to(home) for home in FAMILY_HOMES)] + [REPO / "app.py"]
    assert len(sources) > 100
    # Parsed in a fresh interpreter: tests/support/fresh.py says why.
    assert call_fresh("tests.test_family_walls", "references_in", [str(p) for p in sources]) == []


def references_in(paths: list[str]) -> list[str]:
    """Each family reference in the files at `paths`, by file and line."""
    return [f"{Path(p).relative_to(REPO)}:{hit}" for p in paths for hit in _family_references(Path(p).read_text())]


def test_the_family_check_finds_what_it_looks_for():
    source = "if pool.family is Family.FLUX or family in ('sdxl', 'sd15') or kind != 'zimage':\n    x = Family.SD2\n"
    assert sorted(_family_references(source)) == [
        "1: Family.FLUX",
        "1: family in ('sdxl', 'sd15')",
        "1: kind != 'zimage'",
        "2: Family.SD2",
    ]
    assert _family_references("if pool.family is Family.UNKNOWN and x == 'flux_vae':\n    pass\n") == []


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return _graph(("families", "lora_catalog", "engine", "serving"), typing=True)


@pytest.mark.parametrize("family", list(IDENTITIES))
def test_a_familys_identity_and_spec_are_imported_only_by_its_own_files(family, graph):
    own = {f"families.{family.value}", f"engine.families.{family.value}"}
    # A family built on another declares both its spec and its identity by difference (Wan I2V over Wan).
    built = [f for f, bases in BUILT_ON.items() if family in bases]
    allowed = own | {f"engine.families.{f.value}" for f in built} | {f"families.{f.value}" for f in built}
    importers = sorted(m for m, imported in graph.items() if imported & own and m not in allowed)
    assert importers == []


def test_the_import_check_sees_a_familys_importers(graph):
    # A family's engine spec imports its identity; the variants built on a base import its spec.
    assert "families.sdxl" in graph["engine.families.sdxl"]
    assert "engine.families.flux" in graph["engine.families.flux_kontext"]
