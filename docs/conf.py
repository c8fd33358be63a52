"""Sphinx configuration of the ejkernel documentation (built by `make docs`, warnings as errors)."""

from __future__ import annotations

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # the package as checked out, also without an install
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

# Importing the ops initialises JAX: keep it on the CPU and quiet, whatever machine builds the docs.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import ejkernel  # noqa: E402

project = "ejkernel"
author = "the ejkernel authors"
copyright = "the ejkernel authors, Apache-2.0"
release = version = ejkernel.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "ejkernel_docstrings",  # docs/_ext: blank lines and literal blocks where docutils needs them
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "_static"]

# Docstrings write code in single backticks, as Markdown does: read them as inline literals.
default_role = "literal"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_inherit_docstrings = False  # a Kernel subclass does not repeat Kernel's own docstring
# One parameter per line once a signature passes this width (the op signatures are long).
python_maximum_signature_line_length = 100
autodoc_default_options = {"exclude-members": "__init__, __new__, __post_init__"}

html_theme = "furo"
html_title = f"ejkernel {release}"
html_static_path = ["_static"]
html_css_files = ["ejkernel.css"]
html_show_sourcelink = False
