"""Run a test helper in a fresh interpreter and read its JSON answer.

CPython 3.11.7's `ast.parse` raises `SystemError: AST constructor recursion depth mismatch` when another thread of
the same process builds AST objects at that moment (gh-106905, fixed in later releases). A test worker has such
threads (servers, compilers) left by earlier tests, so the tests that parse the project's sources parse them in a
child process that has no other thread.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CALL = """
import json, sys
sys.path.insert(0, {repo!r})
from importlib import import_module
result = getattr(import_module({module!r}), {function!r})(*json.loads({args!r}))
print(json.dumps(result, default=sorted))
"""


def call_fresh(module: str, function: str, *args: Any) -> Any:
    """`module.function(*args)` evaluated in a new interpreter; sets come back as sorted lists."""
    code = CALL.format(repo=str(REPO), module=module, function=function, args=json.dumps(args))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
