"""The Python examples (examples/python/) run and pass their own checks, with tileattn's
kernels really called (a model whose config says sdpa would pass them without)."""
import pathlib
import runpy

import pytest

torch = pytest.importorskip("torch")

import tileattn.torch as ta  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"


@pytest.mark.parametrize("name", ["quickstart.py", "transformers_generate.py"])
def test_example_runs_on_tileattn(name, monkeypatch):
    if name.startswith("transformers"):
        pytest.importorskip("transformers")
    calls = {"n": 0}
    run = ta._run

    def spy(*args):
        calls["n"] += 1
        return run(*args)

    monkeypatch.setattr(ta, "_run", spy)
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    assert calls["n"] > 0
