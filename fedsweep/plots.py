"""Plots of one run: test accuracy and losses against rounds (the FedLGA paper's Fig. 3 shape)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402


def curves_png(history: list[dict], path: Path, title: str = "") -> Path:
    evals = [h for h in history if "test/accuracy" in h]
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax_acc.plot([h["round"] for h in evals], [h["test/accuracy"] for h in evals], marker=".")
    ax_acc.set(xlabel="round", ylabel="test accuracy", title="test accuracy")
    ax_acc.grid(alpha=0.3)
    ax_loss.plot([h["round"] for h in history], [h["train/loss"] for h in history], label="train (clients)")
    ax_loss.plot([h["round"] for h in evals], [h["test/loss"] for h in evals], marker=".", label="test")
    ax_loss.set(xlabel="round", ylabel="cross-entropy", title="loss")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend()
    # Fixed margins instead of tight_layout, which draws the figure twice: every trial of a sweep
    # renders this plot (0.24 s -> 0.15 s).
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.14, top=0.84 if title else 0.9, wspace=0.22)
    return save_figure(fig, path, title, tight=False)


def save_figure(fig, path: Path, title: str = "", tight: bool = True) -> Path:
    """The common ending of every fedsweep figure: optional title, tight layout, PNG, close."""
    if title:
        fig.suptitle(title)
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
