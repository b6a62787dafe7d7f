#!/usr/bin/env bash
# Installs the optional peer libraries that `shardfeed bench read` and
# `shardfeed bench compare` compare against:
#  - webdataset and litdata into the project's venv (.venv);
#  - MosaicML Streaming into a venv of its own (.venv-peers), because it pins
#    numpy < 2.2 and its package imports torchvision, which cannot load beside
#    the CPU torch wheel. That venv gets the exact torch of .venv (never a CUDA
#    build), numpy < 2.2, Streaming without its declared dependencies (cloud
#    SDKs, torchvision) plus the ones its readers and writers import (boto3 too:
#    `bench remote` has it read s3://, it has no http downloader), and
#    shardfeed itself (editable, no dependencies) for the benchmark's child
#    process. `bench compare` runs Streaming's passes with that venv's python.
#
# Why a constraint file: litdata pulls torchvision, whose newest release pins
# a newer torch; unconstrained, pip replaces the CPU torch with a multi-GB
# CUDA build. The constraint keeps the torch that is installed. A peer that
# still cannot be installed is skipped by the benchmark, never faked.
# Takes 1-2 minutes with pip's cache warm.
set -euo pipefail

cd "$(dirname "$0")/../.."
VENV="${VENV:-.venv}"
PEERS_VENV="${PEERS_VENV:-.venv-peers}"
PY="$VENV/bin/python"
PIP=(-m pip install --disable-pip-version-check -q)
if [ ! -x "$PY" ]; then
    echo "install_peers.sh: no venv at $VENV; run 'make venv' first (or set VENV=path)" >&2
    exit 2
fi

TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__)')"
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"

failed=0
for peer in "webdataset>=0.2.86" "litdata"; do
    echo "installing $peer into $VENV (torch held at $TORCH_VERSION)"
    if ! "$PY" "${PIP[@]}" -c "$CONSTRAINTS" "$peer"; then
        echo "install_peers.sh: could not install $peer; the benchmarks will report it as skipped" >&2
        failed=$((failed + 1))
    fi
done

echo "installing mosaicml-streaming into $PEERS_VENV (torch $TORCH_VERSION, numpy < 2.2, no torchvision)"
PPY="$PEERS_VENV/bin/python"
if { [ -x "$PPY" ] || python3 -m venv "$PEERS_VENV"; } &&
   "$PPY" "${PIP[@]}" -c "$CONSTRAINTS" "torch==$TORCH_VERSION" "numpy<2.2" &&
   "$PPY" "${PIP[@]}" --no-deps "mosaicml-streaming==0.13.0" &&
   "$PPY" "${PIP[@]}" -c "$CONSTRAINTS" "numpy<2.2" brotli "python-snappy<1" "zstd<2" "catalogue<3" filelock \
       pillow "xxhash<4" "tqdm<5" "transformers<5" "boto3<2" &&
   "$PPY" "${PIP[@]}" --no-deps -e .; then
    :
else
    echo "install_peers.sh: could not set up $PEERS_VENV; bench compare will report streaming as skipped" >&2
    failed=$((failed + 1))
fi

# Opt-in (a 424 MB wheel): NVIDIA DALI for `bench images`' CPU pipeline, in a venv of its own (.venv-dali),
# without its declared CUDA codec extras: its CPU decoders need only nvImageCodec's own wheel. No torch.
# FFCV is not installed: ffcv 1.0.2 is a source distribution whose build needs OpenCV 4 (pkg-config)
# and libturbojpeg from the system; `bench images` reports it as skipped with that reason.
if [ "${WITH_DALI:-0}" = 1 ]; then
    DALI_VENV="${DALI_VENV:-.venv-dali}"
    echo "installing nvidia-dali-cuda120 into $DALI_VENV (CPU pipeline; no torch)"
    if { [ -x "$DALI_VENV/bin/python" ] || python3 -m venv "$DALI_VENV"; } &&
       "$DALI_VENV/bin/python" "${PIP[@]}" --no-deps "nvidia-dali-cuda120==2.4.0" "nvidia-nvimgcodec-cu12>=0.9,<0.10" &&
       "$DALI_VENV/bin/python" "${PIP[@]}" numpy optree "astunparse<=1.6.3" "gast<=0.7.0" "six<=1.17" \
           "packaging<=26.3" nvtx makefun "libcst~=1.8" &&
       "$DALI_VENV/bin/python" -c "import nvidia.dali as d; print(f'nvidia-dali {d.__version__}: importable')"; then
        :
    else
        echo "install_peers.sh: could not set up $DALI_VENV; bench images will report DALI as skipped" >&2
        failed=$((failed + 1))
    fi
fi

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
if [ -x "$PPY" ]; then
    "$PPY" - <<'PYEOF' ||
from importlib.metadata import version
from shardfeed.tools.bench.peers import import_streaming
import_streaming()
print(f"mosaicml-streaming {version('mosaicml-streaming')}: importable in its own venv (numpy {version('numpy')})")
PYEOF
        echo "mosaicml-streaming: NOT importable in $PEERS_VENV" >&2
fi
echo "install_peers.sh: done, $failed peer(s) failed to install"
