"""Axis conventions shared by every analysis's figures.

Figures draw run, model and word names as written (`text.parse_math` off: a `$` in a name is not
mathtext). matplotlib's default log-axis tick labels ARE mathtext (`$\\mathdefault{10^{2}}$`), so under
that setting they would print as raw TeX; a log axis gets plain labels instead (1, 10, 100, 1000).
"""

from __future__ import annotations

from matplotlib import ticker


def log_x(ax, *, linthresh: float | None = None) -> None:
  """Log x axis (symlog below `linthresh` when given) with plain tick labels, minor ticks unlabelled."""
  if linthresh is None:
    ax.set_xscale("log")
  else:
    ax.set_xscale("symlog", linthresh=linthresh)
  ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:g}"))  # 1000, not 10^3
  ax.xaxis.set_minor_formatter(ticker.NullFormatter())
