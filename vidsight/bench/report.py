"""Where every benchmark puts its results: a JSON report and a PNG beside it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def write_report(report: dict, out: str | Path, name: str, plot: Callable[[dict, Path], Path]) -> tuple[Path, Path]:
    """Write ``out/NAME.json`` and ``out/NAME.png`` (drawn by ``plot``); returns both paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(report, indent=1, default=str))
    return out / f"{name}.json", plot(report, out / f"{name}.png")


def save_figure(fig, path: str | Path) -> Path:
    """Save and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
