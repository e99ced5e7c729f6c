"""The docs' examples run as tests: every ```python block in docs/*.md and README.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def examples() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for i, code in enumerate(BLOCK.findall(path.read_text())):
            found.append((f"{path.name}:{i}", code))
    return found


@pytest.mark.parametrize(("name", "code"), examples(), ids=[name for name, _ in examples()])
def test_doc_example_runs(name: str, code: str) -> None:
    exec(compile(code, name, "exec"), {})
