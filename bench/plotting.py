"""matplotlib for the benchmarks' plots, headless; a benchmark without it still writes its JSON."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any | None:
    """``matplotlib.pyplot`` on the Agg backend, or None (said once on stdout) where matplotlib
    is not installed: the caller then skips its plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return None
    return plt


def save_figure(plt: Any, fig: Any, path: Any, dpi: int = 120) -> None:
    """Lay ``fig`` out, write it to ``path`` and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
