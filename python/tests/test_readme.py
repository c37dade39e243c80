"""The README's Python quick start runs as written (the first ```python block after
"### Python and PyTorch")."""
import pathlib

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_quick_start_runs():
    text = README.read_text()
    start = text.index("```python", text.index("### Python and PyTorch")) + len("```python")
    code = text[start:text.index("```", start)]
    exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
