"""Sphinx configuration of the numpyro_subsample documentation.

Build: ``sphinx-build -W -b html docs docs/_build/html`` (the ``docs`` extra installs the
packages). The notebooks of ``notebooks/`` are copied into ``docs/examples/`` at build time;
the quick start is executed at reduced size (``NUMPYRO_SUBSAMPLE_DOCS_EXECUTE=off`` skips it).
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import numpyro_subsample  # noqa: E402

project = "numpyro_subsample"
author = "numpyro_subsample developers"
copyright = "2026, numpyro_subsample developers"
release = version = numpyro_subsample.__version__

extensions = [
    "myst_nb",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax served from _static: the pages render offline
]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
html_theme = "pydata_sphinx_theme"
html_title = f"numpyro_subsample {release}"
html_theme_options = {"navigation_with_keys": False}

# --- notebooks: copied from notebooks/; the quick start is executed at reduced size, the
# others are rendered as stored (without outputs: the repository keeps them stripped)
EXAMPLES = HERE / "examples"
EXAMPLES.mkdir(exist_ok=True)
for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
    shutil.copyfile(nb, EXAMPLES / nb.name)
EXECUTED = {"quickstart"}
nb_execution_mode = os.environ.get("NUMPYRO_SUBSAMPLE_DOCS_EXECUTE", "force")
nb_execution_excludepatterns = [f"examples/{p.stem}.ipynb"
                                for p in EXAMPLES.glob("*.ipynb") if p.stem not in EXECUTED]
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
# the executed notebooks read these from the environment of the kernel this process starts
os.environ.setdefault("NUMPYRO_SUBSAMPLE_QUICK", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

# --- API reference: autodoc + numpydoc, validated
autodoc_typehints = "none"
autodoc_member_order = "bysource"
autosummary_generate = False
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
# a public name without these fails the build (with -W): every parameter documented (PR01),
# no documented parameter that the signature lacks (PR02), a Returns section where the
# function returns something (RT01); References are checked below
numpydoc_validation_checks = {"PR01", "PR02", "RT01"}
numpydoc_validation_exclude = {r"\.__init__$", r"\._[a-z]"}

PUBLIC = set(numpyro_subsample.__all__) - {"datasets"}


def _check_references(app, what, name, obj, options, lines):
    """Warn (an error under -W) when a public name of numpyro_subsample lacks References."""
    short = name.rsplit(".", 1)[-1]
    if short not in PUBLIC or getattr(numpyro_subsample, short, None) is not obj:
        return
    if inspect.isclass(obj) and issubclass(obj, Warning):
        return
    if not any(line.strip() in ("References", ".. rubric:: References") for line in lines):
        from sphinx.util import logging

        logging.getLogger(__name__).warning(
            "%s: no References section (cite the paper by author, year, equation)", name,
            type="numpyro_subsample", subtype="references")


_LITERAL = re.compile(r"(``.*?``)")


def _escape_bars(app, what, name, obj, options, lines):
    """Docstrings write norms as |x|: escape bars outside literals (docutils substitutions)."""
    for k, line in enumerate(lines):
        if "|" in line and not line.lstrip().startswith(("|", "+-", "+=")):
            parts = _LITERAL.split(line)
            lines[k] = "".join(p if p.startswith("``") else p.replace("|", r"\|")
                               for p in parts)


def setup(app):
    app.connect("autodoc-process-docstring", _check_references, priority=400)
    app.connect("autodoc-process-docstring", _escape_bars, priority=600)
