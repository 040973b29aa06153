"""The layers keep to their imports: the engine knows no web code, the catalogue no torch, the identities neither."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHECK = """
import importlib, json, sys
for name in {modules!r}:
    importlib.import_module(name)
loaded = set(sys.modules) | {{m.split('.')[0] for m in sys.modules}}
print(json.dumps(sorted(loaded & set({forbidden!r}))))
"""
WEB = ["gradio", "gradio_client", "starlette", "fastapi", "spaces", "uvicorn", "serving", "app"]


def _modules(package: str) -> list[str]:
    """Every module of `package`, its sub-packages' included (by file, so nothing is imported to list them)."""
    names = []
    for path in sorted((REPO / package).rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _imported(modules: list[str], forbidden: list[str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", CHECK.format(modules=modules, forbidden=forbidden)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_engine_pulls_in_no_web_or_space_code():
    assert _imported(["engine"], WEB) == []


def test_no_engine_module_imports_web_space_or_cli_code():
    # One process for all: if none is imported with every engine module loaded, no single module imports one.
    modules = _modules("engine")
    assert len(modules) > 30 and "engine.pools.engine" in modules
    assert _imported(modules, [*WEB, "lora_catalog.__main__"]) == []


def test_the_families_identities_import_no_torch_engine_catalogue_or_web_code():
    # Both the catalogue and the engine read each family's identity, so it may import neither (nor torch).
    modules = _modules("families")
    assert "families.sdxl" in modules and "families.identity" in modules
    assert _imported(modules, ["torch", "diffusers", "transformers", "engine", "lora_catalog", *WEB]) == []
