"""docs/tutorial.ipynb runs from top to bottom in a fresh kernel, in a folder outside the repository
(its cells assert what they claim), and the copy in the repository holds the outputs of a real run,
so it reads well where notebooks are rendered; without attn-mt its first cell says what to install,
in one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "tutorial.ipynb"


def test_the_stored_notebook_shows_its_outputs_and_no_machine_paths():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    # all but the first and two quiet steps
    assert sum(bool(c["outputs"]) for c in code) >= len(code) - 3
    html = [o for c in code for o in c["outputs"] if "text/html" in o.get("data", {})]
    # the model view, the explanations and the heads report, as they were drawn
    assert len(html) >= 3
    # the model view's picture for renderers without HTML
    assert any("image/png" in o.get("data", {}) for o in html)
    text = json.dumps([c["outputs"] for c in code])
    assert not re.search(r"/(tmp|home|root|work)/", text) and str(ROOT) not in text
    assert not any(o.get("output_type") == "error" for c in code for o in c["outputs"])


def test_the_first_cell_says_what_to_install_where_attn_mt_is_missing(tmp_path):
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    first = "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])
    hide = "import sys\nsys.modules['attn_mt'] = None  # as if attn-mt were not installed\n"
    done = subprocess.run([sys.executable, "-c", hide + first], cwd=tmp_path, capture_output=True,
                          text=True)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert (done.stderr.strip().startswith("This notebook needs attn-mt")
            and "pip install" in done.stderr)


@pytest.mark.slow
def test_the_tutorial_runs_and_its_views_render(tmp_path):
    nbclient, nbformat = pytest.importorskip("nbclient"), pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}
                            ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    # the attention view, the explanation and the heads report drew themselves
    assert len(html) >= 3
    fetches = re.compile(
        r"""(src|href)\s*=\s*["']?(https?:)?//|url\(\s*["']?https?:|@import|fetch\(""")
    assert not any(fetches.search(h) for h in html)  # offline: nothing loaded from anywhere
    assert (tmp_path / "runs" / "tutorial" / "results.json").is_file()
    assert not any(o.get("output_type") == "error" for o in outputs)
