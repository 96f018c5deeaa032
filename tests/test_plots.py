"""curves_png keeps one figure per process and refills it: each PNG must be what a new figure draws."""
import subprocess
import sys
from pathlib import Path

from fedsweep.runs.plots import curves_png


def _history(rounds: int, scale: float) -> list[dict]:
    rows = [{"round": r, "train/loss": scale / r} for r in range(1, rounds + 1)]
    for h in rows[4::5]:
        h.update({"test/accuracy": 1 - 0.5 / h["round"], "test/loss": 2 * scale / h["round"]})
    return rows


def test_a_refilled_figure_draws_what_a_new_one_draws(tmp_path: Path):
    # A long run first (wide axes, a title), then a short one without a title: nothing of the first
    # (limits, lines, title) may remain in the second's PNG.
    curves_png(_history(100, 9.0), tmp_path / "long.png", title="fedavg on digits")
    curves_png(_history(30, 1.0), tmp_path / "short.png")
    subprocess.run([sys.executable, "-c", f"""
from pathlib import Path
from tests.test_plots import _history
from fedsweep.runs.plots import curves_png
curves_png(_history(30, 1.0), Path({str(tmp_path / 'fresh.png')!r}))
"""], check=True, cwd=Path(__file__).parent.parent)
    assert (tmp_path / "short.png").read_bytes() == (tmp_path / "fresh.png").read_bytes()
    assert (tmp_path / "long.png").read_bytes() != (tmp_path / "short.png").read_bytes()


def test_the_title_is_drawn(tmp_path: Path):
    curves_png(_history(30, 1.0), tmp_path / "titled.png", title="fedlga on digits")
    curves_png(_history(30, 1.0), tmp_path / "plain.png")
    assert (tmp_path / "titled.png").read_bytes() != (tmp_path / "plain.png").read_bytes()


def _pixels(path: Path):
    import numpy as np
    from PIL import Image
    return np.asarray(Image.open(path).convert("RGBA"))


def test_a_plot_over_the_kept_background_is_a_full_draw_pixel_for_pixel(tmp_path: Path):
    # Same rounds (so the kept background is reused), other losses, accuracies and title: the y
    # axes, curves, legend and title drawn over it must be exactly what matplotlib's full draw of
    # that figure gives.
    import fedsweep.runs.plots as plots
    curves_png(_history(100, 9.0), tmp_path / "first.png", title="fedavg on digits")
    key = plots._curves.background_key
    second = _history(100, 0.02)
    for h in second[4::5]:
        h["test/accuracy"] = 0.1 + h["round"] / 1000
    curves_png(second, tmp_path / "second.png", title="fedlga on synthetic")
    assert plots._curves.background_key == key                       # the background was reused
    plots._curves.fig.savefig(tmp_path / "full.png", dpi=plots._Curves.DPI)
    assert (_pixels(tmp_path / "second.png") == _pixels(tmp_path / "full.png")).all()
    from PIL import Image
    assert Image.open(tmp_path / "second.png").mode == "RGB"         # opaque: written without alpha
    assert (_pixels(tmp_path / "second.png") != _pixels(tmp_path / "first.png")).any()


def test_each_method_has_one_colour_in_every_plot(tmp_path: Path):
    """Every algorithm has its own colour, the same in every report whichever methods it holds, and
    a run's curves.png draws in it (refilled after another method's, as a new figure would)."""
    import matplotlib.colors as mcolors

    from fedsweep.algorithms import available
    from fedsweep.reports.plots import _colors
    from fedsweep.runs.plots import METHOD_COLORS, method_color
    assert set(METHOD_COLORS) == set(available()) and len(set(METHOD_COLORS.values())) == len(METHOD_COLORS)
    assert _colors(["fedavg", "fedlga"])["fedavg"] == _colors(["scaffold", "fedavg"])["fedavg"] == "#1f77b4"
    assert method_color("fedlga_damped") == method_color("fedlga_damped") not in METHOD_COLORS.values()
    curves_png(_history(30, 1.0), tmp_path / "avg.png", method="fedavg")
    curves_png(_history(30, 1.0), tmp_path / "lga.png", method="fedlga")
    subprocess.run([sys.executable, "-c", f"""
from pathlib import Path
from tests.test_plots import _history
from fedsweep.runs.plots import curves_png
curves_png(_history(30, 1.0), Path({str(tmp_path / 'fresh.png')!r}), method="fedlga")
"""], check=True, cwd=Path(__file__).parent.parent)
    assert (tmp_path / "lga.png").read_bytes() == (tmp_path / "fresh.png").read_bytes()
    red = tuple(round(255 * c) for c in mcolors.to_rgb(METHOD_COLORS["fedlga"]))
    pixels = {tuple(p) for p in _pixels(tmp_path / "lga.png")[..., :3].reshape(-1, 3)}
    assert red in pixels and red not in {tuple(p) for p in _pixels(tmp_path / "avg.png")[..., :3].reshape(-1, 3)}


def test_a_validation_curve_is_drawn_where_the_run_has_one(tmp_path: Path):
    with_val = _history(30, 1.0)
    for h in with_val[4::5]:
        h["val/accuracy"] = 0.9 - 0.5 / h["round"]
    curves_png(with_val, tmp_path / "val.png")
    curves_png(_history(30, 1.0), tmp_path / "plain.png")        # refilled: no validation line, no legend
    subprocess.run([sys.executable, "-c", f"""
from pathlib import Path
from tests.test_plots import _history
from fedsweep.runs.plots import curves_png
curves_png(_history(30, 1.0), Path({str(tmp_path / 'fresh.png')!r}))
"""], check=True, cwd=Path(__file__).parent.parent)
    assert (tmp_path / "plain.png").read_bytes() == (tmp_path / "fresh.png").read_bytes()
    assert (tmp_path / "val.png").read_bytes() != (tmp_path / "plain.png").read_bytes()
