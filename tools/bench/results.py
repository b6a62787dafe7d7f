"""The benchmarks' one report writer: a run's markdown tables, its JSON and CSV, and its plots, under --out.

Every benchmark renders its own text (what its columns mean is its own), then hands the files to ``write``:
``{"bench_x.md": text, "bench_x.json": data, "bench_x.csv": Rows(columns, rows)}``; the suffix says how each
is written (JSON with indent 1, values it cannot encode as strings; CSV one row a dict). ``table`` makes a
markdown table, ``cell`` formats one value, ``machine`` the machine line, ``add_out`` the --out option, and
``figure`` / ``save`` hold the matplotlib set-up (Agg, no display) and tear-down that every plot shares.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Rows:
    """A CSV file's content: the columns in order and one dict a row (a key left out is an empty cell)."""

    columns: tuple[str, ...]
    rows: list[dict]


def write(out: str, files: dict[str, object], say: str | None = None) -> list[str]:
    """Each ``name -> content`` into ``out`` (made if missing), by the name's suffix: ``.md`` text, ``.json``
    any JSON-able value, ``.csv`` a ``Rows``. Returns the paths, in the order given; with ``say`` (the
    benchmark's name) also prints ``bench NAME: results in PATHS``."""
    os.makedirs(out, exist_ok=True)
    paths = []
    for name, content in files.items():
        path = os.path.join(out, name)
        if name.endswith(".json"):
            with open(path, "w") as f:
                json.dump(content, f, indent=1, default=str)
        elif name.endswith(".csv"):
            if not isinstance(content, Rows):
                raise TypeError(f"{name}: a CSV file's content is a results.Rows, not {type(content).__name__}")
            with open(path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(content.columns), extrasaction="ignore")
                w.writeheader()
                w.writerows(content.rows)
        elif name.endswith(".md"):
            with open(path, "w") as f:
                f.write(content)
        else:
            raise ValueError(f"{name}: the report writer writes .md, .json and .csv files")
        paths.append(path)
    if say:
        print(f"bench {say}: results in {', '.join(paths)}")
    return paths


def add_out(parser) -> None:
    """``--out``, the folder every benchmark writes its results into, where the parser has none yet."""
    if not any("--out" in a.option_strings for a in parser._actions):
        parser.add_argument("--out", default="bench-results", help="folder for the results (default: %(default)s)")


def machine(when: str = "at the end") -> str:
    """The machine line of a report: cores and the 1-minute load average ``when``."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{os.cpu_count()} cores, 1-min load {load:.1f} {when}"


def cell(value, spec: str = ",.0f", missing: str = "–") -> str:
    """One table cell: ``value`` formatted, ``missing`` for None."""
    return missing if value is None else format(value, spec)


def table(header: list[str], rows: list[list], align: str = "") -> str:
    """A markdown table; ``align`` has one letter a column, ``l`` or ``r`` (default: all left). A ``|`` in a
    cell becomes ``/``, so a status carrying one cannot cut its row."""
    align = align or "l" * len(header)
    if len(align) != len(header):
        raise ValueError(f"table: {len(header)} columns but {len(align)} alignments ({align!r})")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("--:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def figure(nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] = (7, 5)):
    """``(plt, fig, axes)`` of a new matplotlib figure on the Agg backend (no display); ``axes`` a 2-D
    array, ``squeeze=False``. matplotlib is an extra: its absence is an error saying how to install it."""
    from shardfeed.tools.extras import require

    matplotlib = require("matplotlib", "the benchmark plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=figsize, squeeze=False)
    return plt, fig, axes


def save(fig, path: str, dpi: int = 100) -> str:
    """The figure laid out, written to ``path`` and closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
