"""notebooks/walkthrough.ipynb runs top to bottom in a real kernel and shows what it promises."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "walkthrough.ipynb"

pytestmark = pytest.mark.slow


def test_walkthrough_notebook_runs_and_shows_statistics_schema_and_curves(tmp_path, monkeypatch):
    monkeypatch.setenv("FULLTHROTTLE_NOTEBOOK_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("FULLTHROTTLE_NOTEBOOK_STEPS", "100")
    temp = tmp_path / "temp"  # the kernel's temp folder
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails

    outputs = [
        output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
    ]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    html = "\n".join(o.get("data", {}).get("text/html", "") for o in outputs if "data" in o)
    # Statistics (the facets overview) and the schema (a table naming the features).
    assert "facets" in html.lower()
    assert "bill_length_mm" in html and "island" in html
    # Transformed features, the trainer's progress, a training-curve image, a falling loss.
    assert "bill_length_mm_xf" in text
    assert "[trainer] done: 100 steps" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
    losses = re.search(r"training loss: first loop ([\d.]+), last loop ([\d.]+)", text)
    assert losses, text[-2000:]
    first, last = map(float, losses.groups())
    assert last < first
    assert "blessed: True" in text
    # Under IPython Beam leaves a temp folder per pipeline; the notebook's scratch folders took
    # them away.
    assert sorted(p.name for p in temp.iterdir()) == []
    # The notebook file itself stays free of outputs (it is executed here, not stored run).
    assert all(
        not cell.get("outputs")
        for cell in json.loads(NOTEBOOK.read_text())["cells"]
        if cell["cell_type"] == "code"
    )
