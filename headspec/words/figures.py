"""Figures shared by every analysis: one way to make a figure, and the axis conventions.

Every figure is a `matplotlib.figure.Figure` made directly (`new_figure`), never through pyplot: pyplot keeps
a global list of open figures and a process-wide backend, and a library that sets either (`matplotlib.use`,
`plt.subplots`) switches a notebook's inline plots off or draws its figures twice. `fig.savefig` picks the
canvas from the file's format, so no backend is needed to write a file. A figure returned to a notebook shows
itself once, as a PNG (`NotebookFigure._repr_png_`), whether or not pyplot's inline backend was activated.

Figures draw run, model and word names as written (`text.parse_math` off: a `$` in a name is not
mathtext). matplotlib's default log-axis tick labels ARE mathtext (`$\\mathdefault{10^{2}}$`), so under
that setting they would print as raw TeX; a log axis gets plain labels instead (1, 10, 100, 1000).
"""

from __future__ import annotations

import io

from matplotlib import figure, ticker


class NotebookFigure(figure.Figure):
  """A Figure that IPython displays as one PNG. IPython asks a type's registered formatter first (the
  inline backend registers one for every Figure once pyplot activates it) and `_repr_png_` otherwise, so
  the image is shown once either way; pyplot never holds it, so nothing draws it a second time."""

  def _repr_png_(self) -> bytes:
    buffer = io.BytesIO()
    self.savefig(buffer, format="png", bbox_inches="tight")  # as the inline backend draws (matplotlib-inline)
    return buffer.getvalue()


def new_figure(nrows: int = 1, ncols: int = 1, *, figsize, dpi: float | None = None, **subplots):
  """(figure, axes) of a new NotebookFigure, outside pyplot: `Figure.subplots(nrows, ncols, **subplots)`
  (`squeeze`, `sharex`, ... as in `plt.subplots`)."""
  fig = NotebookFigure(figsize=figsize, **({} if dpi is None else {"dpi": dpi}))
  return fig, fig.subplots(nrows, ncols, **subplots)


def log_x(ax, *, linthresh: float | None = None) -> None:
  """Log x axis (symlog below `linthresh` when given) with plain tick labels, minor ticks unlabelled."""
  if linthresh is None:
    ax.set_xscale("log")
  else:
    ax.set_xscale("symlog", linthresh=linthresh)
  ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:g}"))  # 1000, not 10^3
  ax.xaxis.set_minor_formatter(ticker.NullFormatter())
