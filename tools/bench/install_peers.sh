#!/usr/bin/env bash
# Installs the optional peer libraries that `shardfeed bench read` compares
# against (webdataset, litdata) into the project's venv.
#
# Why a constraint file: litdata pulls torchvision, whose newest release pins
# a newer torch; unconstrained, pip replaces the CPU torch with a multi-GB
# CUDA build. The constraint keeps the torch that is installed. A peer that
# still cannot be installed is skipped by the benchmark, never faked.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
    echo "install_peers.sh: no venv at $VENV; run 'make venv' first (or set VENV=path)" >&2
    exit 2
fi

TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')"
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"

failed=0
for peer in "webdataset>=0.2.86" "litdata"; do
    echo "installing $peer (torch held at $TORCH_VERSION)"
    if ! "$PY" -m pip install --disable-pip-version-check -q -c "$CONSTRAINTS" "$peer"; then
        echo "install_peers.sh: could not install $peer; bench read will report it as skipped" >&2
        failed=$((failed + 1))
    fi
done

"$PY" - <<'PYEOF'
import importlib
import torch
for name in ("webdataset", "litdata"):
    try:
        mod = importlib.import_module(name)
        print(f"{name} {getattr(mod, '__version__', '?')}: importable")
    except Exception as e:  # report, the bench skips it
        print(f"{name}: NOT importable ({type(e).__name__}: {e})")
print(f"torch {torch.__version__} (unchanged)")
PYEOF
echo "install_peers.sh: done, $failed peer(s) failed to install"
