"""The README and docs/ stay true: every setting they name exists, every setting is documented, every command runs,
every relative link resolves, and the README is a Space card quoting only result lines docs/ holds."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from engine.settings import Env, Settings

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
CONFIGURATION = REPO / "docs" / "configuration.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]

# Variables the docs may name that are no `Settings` field: MODELS is read by `Settings.from_env` itself (it sets
# several fields at once); the rest belong to the libraries (huggingface_hub, torch's inductor, OpenMP, which
# serving/cluster/app.py forwards to replicas; Gradio's temp folder) and are read there, not by us.
NOT_SETTINGS = {
    "MODELS",
    "HF_ENDPOINT",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "TORCHINDUCTOR_CACHE_DIR",
    "TORCHINDUCTOR_FREEZING",
    "OMP_NUM_THREADS",
    "GRADIO_TEMP_DIR",
}
# Backticked upper-case words the docs use as values or placeholders, not variables: log levels, Civitai's
# ratings, and the parts of a MODELS entry (`MODEL=BASE`, `REPO=<base>`).
VALUES = {"DEBUG", "INFO", "WARNING", "ERROR", "PG", "PG13", "R", "X", "XXX", "MODEL", "BASE", "REPO"}
BACKTICKED_NAME = re.compile(r"`([A-Z][A-Z0-9_]*)(?:=[^`]*)?`")
PYTHON_MODULE = re.compile(r"python3? -m ([A-Za-z_][\w.]*)")
CODE_BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)


def _settings_env_names() -> set[str]:
    return {meta.var for field in Settings.model_fields.values() for meta in field.metadata if isinstance(meta, Env)}


def _named_variables(path: Path) -> set[str]:
    return {name for name in BACKTICKED_NAME.findall(path.read_text()) if name not in VALUES}


def test_every_variable_the_docs_name_is_read() -> None:
    known = _settings_env_names() | NOT_SETTINGS
    named = {(path.name, name) for path in (README, CONFIGURATION) for name in _named_variables(path)}
    assert {(doc, name) for doc, name in named if name not in known} == set()


def test_every_setting_is_documented() -> None:
    documented = _named_variables(README) | _named_variables(CONFIGURATION)
    assert _settings_env_names() - documented == set()


def test_the_patterns_see_the_settings() -> None:
    """Guards the two tests above against a pattern that matches nothing."""
    assert {"HOST_RAM_BYTES", "MODELS", "GRADIO_SERVER_PORT"} <= _named_variables(CONFIGURATION)
    assert "HOST_RAM_BYTES" in _settings_env_names()


def _module_exists(name: str) -> bool:
    path = REPO / name.replace(".", "/")
    if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
        return True
    # Not ours: a tool the set-up installs (pytest, mypy) must be importable where the tests run.
    return not (REPO / name.split(".")[0]).exists() and importlib.util.find_spec(name) is not None


def test_every_python_module_named_exists() -> None:
    named = {(path.relative_to(REPO).as_posix(), m) for path in DOCS for m in PYTHON_MODULE.findall(path.read_text())}
    assert any(module == "lora_catalog" for _, module in named)
    assert {(doc, module) for doc, module in named if not _module_exists(module)} == set()


def test_every_file_the_readme_commands_run_exists() -> None:
    code = "\n".join(CODE_BLOCK.findall(README.read_text()))
    scripts = set(re.findall(r"\bbash (\S+\.sh)\b", code))
    tools = set(re.findall(r"\.venv/bin/([\w.-]+)", code))
    assert ".ci/setup-tests.sh" in scripts and "python" in tools
    assert {script for script in scripts if not (REPO / script).is_file()} == set()
    # .venv is made by the set-up; the tools it names must be in the environment the tests run in.
    assert {tool for tool in tools if not (Path(sys.executable).parent / tool).exists()} == set()


CI_RUN = REPO / ".ci" / "run"
README_MAX_LINES = 300  # issue 40: the README is the Space card; the rest lives in docs/.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
RESULT_LINE = re.compile(r"^\s*python -m bench\.\S+(?: --?\S+(?: [^\s=]+)?)*\s+((?:[a-z_][a-z0-9_]*=\S+\s*)+)$", re.M)


def _prose(path: Path) -> str:
    """The file without its fenced code blocks (a `# comment` in a bash block is no heading)."""
    return CODE_BLOCK.sub("", path.read_text())


def _anchors(path: Path) -> set[str]:
    """The heading anchors GitHub (and the Hub) give a Markdown file: lower case, punctuation but `-` and `_` dropped,
    spaces to `-`, a repeated one numbered."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in HEADING.findall(_prose(path)):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_the_readme_is_a_space_card_of_at_most_300_lines() -> None:
    lines = README.read_text().splitlines()
    assert lines[0] == "---" and "app_file: app.py" in lines
    assert len(lines) <= README_MAX_LINES


def test_the_readme_test_command_is_what_ci_runs() -> None:
    ci_command = CI_RUN.read_text().strip().splitlines()[-1]
    commands = [line for block in CODE_BLOCK.findall(README.read_text()) for line in block.splitlines()]
    assert ci_command in commands


def test_every_relative_link_resolves() -> None:
    broken = set()
    for path in DOCS:
        for target in LINK.findall(_prose(path)):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in _anchors(linked)):
                broken.add((path.relative_to(REPO).as_posix(), target))
    assert broken == set()


def test_the_links_see_the_anchors() -> None:
    """Guards the test above against a slug rule or pattern that matches nothing."""
    assert "memory-plan-notes-flux1-z-image-and-the-host-ram-encoders" in _anchors(CONFIGURATION)
    assert any(target.endswith("#hardware") for target in LINK.findall(_prose(CONFIGURATION)))


def test_every_result_line_the_readme_quotes_is_in_the_benchmarks() -> None:
    measured = " ".join(" ".join(path.read_text().split()) for path in DOCS if path != README)
    quoted = [" ".join(line.split()) for line in RESULT_LINE.findall(README.read_text())]
    assert len(quoted) >= 3
    assert [line for line in quoted if line not in measured] == []
