"""`shardfeed demo`'s balance phase: one rank simulated 3x slower, equal batch sizes against --balance.

Two short trainings on the demo's data with ``--slow-rank 1:3`` (rank 1
repeats its forward/backward work twice more a step, printed by the trainer
as a simulation): the equal split, then ``--balance``. Reports each run's
samples/s (the trainer's summary) and the balanced run's sizes, and where
the balanced run's plot (samples/s over steps) is.
"""

from __future__ import annotations

import os
import re


def balance_phase(args, train_cmd, run, root: str, out: str) -> str | None:
    """Runs the two trainings through the demo's ``train_cmd(args, data, *extra)`` and ``run(cmd, tag)``;
    the line to print at the end, or None when a run failed."""
    print("\n== mixed hardware, simulated: rank 1 does its forward/backward work 3x (--slow-rank 1:3); "
          "equal batch sizes, then --balance (sizes from measured compute time)", flush=True)
    rates, sizes = {}, None
    for name, extra in (("equal", []), ("balanced", ["--balance", "--balance-every", "10"])):
        plot = os.path.join(out, f"balance-{name}-plot.png")
        rc, text = run(train_cmd(args, root, "--epochs", "1", "--slow-rank", "1:3", "--plot", plot, *extra),
                       f"slow-{name}")
        if rc:
            return None
        found = re.search(r"\(([\d,]+) samples/s\)", text)
        rates[name] = float(found[1].replace(",", "")) if found else None
        if name == "balanced":
            changes = re.findall(r"batch sizes [\d,]+ -> ([\d,]+)", text)
            sizes = changes[-1] if changes else None
    if None in rates.values():
        return None
    per_rank = args.batch_size
    return (f"one rank 3x slower (simulated): {rates['equal']:,.0f} samples/s at equal sizes {per_rank},{per_rank}, "
            f"{rates['balanced']:,.0f} with --balance (sizes {sizes or 'unchanged'}): "
            f"{rates['balanced'] / rates['equal']:.2f}x; plot {os.path.join(out, 'balance-balanced-plot.png')}")
