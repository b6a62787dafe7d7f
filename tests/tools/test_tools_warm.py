"""`python -m shardfeed.tools.warm` (run by make after installing) reads every
kernel's path once and says where the compiled code is kept."""

import subprocess
import sys


def test_warm_reads_through_every_order_and_names_the_cache():
    # --no-aot: the reads only (the compiled module's build is tests/formats/test_aot.py's)
    out = subprocess.run([sys.executable, "-m", "shardfeed.tools.warm", "--no-aot"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    # 32 samples through 4 orders: tar in 2 read modes, Parquet, Arrow; 8 large samples twice (gathered
    # into bytes objects); plus the 4-member foreign tar scanned
    assert "jitted kernels ready" in out.stdout and "(532 samples read; cache " in out.stdout
