"""``glue``: hand a value computed in a chapter to the chapter's prose, with or without the book's build.

The book's build (myst-nb) shows glued values in the text (through its ``glue:text`` role). In a plain Jupyter or
Colab kernel, where myst-nb is not installed (the light ``dualview[book]`` install), :func:`glue` keeps the
value in :data:`values` and, with ``display=True``, shows it as any cell output would.
"""
from __future__ import annotations

from typing import Any

#: every value glued in this process, by name (also when myst-nb does the gluing)
values: dict[str, Any] = {}


def glue(name: str, variable: Any, display: bool = True) -> None:
    """Glue ``variable`` under ``name``: with myst-nb, ``myst_nb.glue`` (the book's text shows it);
    without it, record it in :data:`values` and show it if ``display``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a glued value needs a non-empty string name, got {name!r}")
    values[name] = variable
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        if display:
            try:
                from IPython.display import display as show
            except ImportError:
                print(f"{name} = {variable!r}")
            else:
                show(variable)
    else:
        myst_glue(name, variable, display=display)
