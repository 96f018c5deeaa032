"""Plots of one run: test accuracy and losses against rounds (the FedLGA paper's Fig. 3 shape)."""
from __future__ import annotations

import threading
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402  (matplotlib's own PNG writer)


class _Curves:
    """The one figure of :func:`curves_png`, kept for the life of the process and refilled for each
    run: every trial of a sweep renders this plot (72 of them in sweeps/fedlga.yaml, each in a Ray
    worker that is also training).

    Most of a plot is the same from run to run of a sweep: the figure, both axes' frames, titles,
    x ticks and grid (the x range is the run's rounds). That part is drawn once per x range, with
    the parts that change hidden, and kept as a pixel buffer (matplotlib's blitting). A run then
    costs the buffer's copy and what is its own: the y axes (their limits are the run's), the
    curves, the legend (placed where the curves are not) and the title: 40 -> 27 ms a plot on
    2 CPU cores (benchmarks/README.md), and the PNG is pixel for pixel the full draw's; 24 -> 20 ms
    more for writing it as RGB at zlib level 3 (below)."""

    DPI = 110

    def __init__(self):
        self.fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=self.DPI)
        self.axes = (ax_acc, ax_loss)
        (self.acc,) = ax_acc.plot([], [], marker=".", label="test")
        (self.val,) = ax_acc.plot([], [], ls=":", label="validation")   # runs with a validation split
        ax_acc.set(xlabel="round", ylabel="accuracy", title="accuracy")
        ax_acc.grid(alpha=0.3)
        (self.train,) = ax_loss.plot([], [], ls="--", label="train (clients)")
        (self.test,) = ax_loss.plot([], [], marker=".", label="test")
        ax_loss.set(xlabel="round", ylabel="cross-entropy", title="loss")
        ax_loss.grid(alpha=0.3)
        self.legend = ax_loss.legend()
        self.acc_legend = ax_acc.legend(loc="lower right")
        self.title = self.fig.suptitle("")
        # Drawn over the kept background, in this order (the order of a full draw).
        self.changing = [ax_acc.yaxis, ax_loss.yaxis, self.acc, self.val, self.train, self.test,
                         *ax_acc.spines.values(), *ax_loss.spines.values(), self.acc_legend, self.legend, self.title]
        self.background, self.background_key = None, None
        self.lock = threading.Lock()   # a Ray worker runs its trials in threads, one at a time

    def render(self, history: list[dict], path: Path, title: str, color: str = "C0") -> Path:
        evals = [h for h in history if "test/accuracy" in h]
        with self.lock:
            for line in (self.acc, self.val, self.train, self.test, *self.legend.legend_handles,
                         *self.acc_legend.legend_handles):
                line.set_color(color)
            self.acc.set_data([h["round"] for h in evals], [h["test/accuracy"] for h in evals])
            vals = [h for h in evals if "val/accuracy" in h]
            self.val.set_data([h["round"] for h in vals], [h["val/accuracy"] for h in vals])
            self.acc_legend.set_visible(bool(vals))
            self.train.set_data([h["round"] for h in history], [h["train/loss"] for h in history])
            self.test.set_data([h["round"] for h in evals], [h["test/loss"] for h in evals])
            for ax in self.axes:   # limits from this run's data alone
                ax.relim()
                ax.autoscale_view()
            self.title.set_text(title)
            # Fixed margins instead of tight_layout, which draws the figure twice.
            self.fig.subplots_adjust(left=0.07, right=0.98, bottom=0.14, top=0.84 if title else 0.9, wspace=0.22)
            key = (tuple(ax.get_xlim() for ax in self.axes), bool(title))
            if key != self.background_key:
                self._draw_background()
                self.background_key = key
            canvas = self.fig.canvas
            canvas.restore_region(self.background)
            for artist in self.changing:
                self.fig.draw_artist(artist)
            width, height = canvas.get_width_height()
            image = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
            # The figure is opaque (alpha 255 everywhere): RGB, and zlib level 3 rather than PIL's 6,
            # make the same picture in 6.6 ms instead of 11.6 ms, and a smaller file (59 KB, not 61 KB).
            image.convert("RGB").save(path, format="png", dpi=(self.DPI, self.DPI), compress_level=3)
        return path

    def _draw_background(self) -> None:
        """Draw the figure without the parts that change from run to run and keep its pixels."""
        shown = [artist.get_visible() for artist in self.changing]
        for artist in self.changing:
            artist.set_visible(False)
        try:
            self.fig.canvas.draw()
            self.background = self.fig.canvas.copy_from_bbox(self.fig.bbox)
        finally:
            for artist, visible in zip(self.changing, shown):
                artist.set_visible(visible)


#: One colour per algorithm, the same in every plot of every report (FedAvg is always blue, FedLGA
#: red), so reports of different sweeps read alike; distinct hues for the methods that meet in one sweep.
METHOD_COLORS = {
    "fedavg": "#1f77b4", "fedlga": "#d62728", "scaffold": "#2ca02c", "feddyn": "#9467bd", "fedprox": "#ff7f0e",
    "fednova": "#8c564b", "fedcm": "#e377c2", "mimelite": "#7f7f7f", "fedsam": "#bcbd22", "fedsoftmax": "#17becf",
    "clg_sgd": "#393b79", "fedclg_c": "#e6550d", "fedclg_s": "#31a354", "scaffold_plus": "#843c39",
    "server_only": "#000000", "fedmax": "#7b4173", "fedmax_k": "#637939", "gen_fedavg": "#6baed6",
    "fedavg_ft": "#6a3d9a", "ditto": "#a6761d", "fedper": "#1b9e77", "fedrep": "#d95f02", "qffl": "#e7298a",
    "fedbn": "#66a61e"}
#: For method labels that are not an algorithm's name (``fedlga_damped``), picked by the label's hash.
OTHER_COLORS = ("#ad494a", "#8ca252", "#bd9e39", "#a55194", "#5254a3", "#6b6ecf", "#e7969c", "#9c9ede",
                "#cedb9c", "#e7cb94")


def method_color(method: str) -> str:
    import zlib
    return METHOD_COLORS.get(method) or OTHER_COLORS[zlib.crc32(method.encode()) % len(OTHER_COLORS)]



_curves: _Curves | None = None


def curves_png(history: list[dict], path: Path, title: str = "", method: str | None = None) -> Path:
    """Test accuracy and the losses of one run against rounds, as a PNG at ``path``, in ``method``'s
    colour (the one it has in every report plot)."""
    global _curves
    if _curves is None:
        _curves = _Curves()
    return _curves.render(history, path, title, method_color(method) if method else "C0")


def save_figure(fig, path: Path, title: str = "") -> Path:
    """The common ending of the report's figures: optional title, tight layout, PNG, close."""
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
