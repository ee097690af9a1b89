"""Sphinx configuration of dasknn's documentation site.

Sphinx with numpydoc, because dasknn's docstrings are numpydoc (scikit-learn's, dask's and
numpy's convention) and autodoc renders them from the installed package as they are; MyST lets
the guide and docs/architecture.md stay Markdown, and sphinx-argparse writes the command-line page
from `dasknn.cli.build_parser()`, so it cannot drift from `dasknn --help`. Build it with
`python -m sphinx -W -b html docs docs/_build/html` (the `docs` extra); no page needs the network.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # document the checkout this folder is in

from dasknn.version import __version__  # noqa: E402

project = "dasknn"
author = "dasknn developers"
copyright = "dasknn developers"  # noqa: A001 (Sphinx's name)
release = version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "numpydoc",
    "sphinxarg.ext",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"
smartquotes = False  # options stay `--time-budget` (no en dash), quotes as typed

# numpydoc renders the sections; no member tables (the API pages list the members they show)
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
autodoc_typehints = "none"  # the numpydoc sections give the types in words
autodoc_member_order = "bysource"

myst_heading_anchors = 3

html_theme = "alabaster"
html_title = f"dasknn {release}"
html_theme_options = {"description": "Omnivore on Dask: distributed CNN training", "show_relbars": True}
