"""Log axes keep readable tick labels where names are drawn as written (text.parse_math off)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from headspec.words import figures  # noqa: E402


@pytest.mark.parametrize("linthresh", [None, 30.0])
def test_log_axis_labels_are_plain_numbers_without_mathtext(linthresh):
  with matplotlib.rc_context({"text.parse_math": False}):
    fig, ax = plt.subplots()
    ax.plot([1, 30, 200, 800], [0, 1, 2, 3])
    figures.log_x(ax, linthresh=linthresh)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    plt.close(fig)
  assert labels and not any("$" in s or "mathdefault" in s for s in labels)
  assert "100" in labels
