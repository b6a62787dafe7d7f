"""`shardfeed bench images`: the ImageNet training read on real photographs: JPEG decode +
RandomResizedCrop + flip -> uint8 CHW in the workers, images/s and images/s per core at 0 and 2 workers.

    shardfeed bench images [--photos DIR] [--samples 2048] [--workers 0,2] [--repeat 3] [--out DIR]

Data: the photographs in --photos (default: scikit-image's sample photos, ``skimage/data``, where
scikit-image is installed; ``pip download --no-deps scikit-image`` and unzipping ``skimage/data/*`` gives
the same without installing it), cut and resized to 500x375 (ImageNet's typical size) at random and
re-encoded as JPEG quality 90, one sample each, 1,000 classes.

Variants (each the same transform, loader/image_crops.py RandomResizedCropFlip, batch 64), in one of three modes:
*exact* (``draft=False, resize="pil"``: torchvision's computation, pixel for pixel), *draft* (pillow's
reduced-size decoding where the crop allows, pillow's resize) and *fast* (the default: draft, and torch's
antialiased uint8 resize of a crop decoded at full size):
- **shardfeed**: tar shards, ``ShardDataset(decode=False, transform=...)`` + ``Loader``; at 224 in each mode,
  and fast at 160 and 128 (the low-res stages of progressive resizing, where libjpeg decodes at 1/2-1/8
  scale);
- **ImageFolder + PIL**: ``ROOT/CLASS/KEY.jpg`` read by a map-style Dataset that opens each file with PIL
  and applies the transform without draft: what torchvision's ImageFolder + RandomResizedCrop +
  RandomHorizontalFlip + PILToTensor does (torchvision itself is not installed here: its PyPI wheel
  links the CUDA torch, so this is the same computation in plain PIL), ``DataLoader(shuffle=True)``;
- **webdataset**: the same tar shards through ``wds.WebDataset(...).shuffle(1000).map(...)``, WebLoader;
- **DALI, CPU pipeline** (tools/bench/images_dali.py): the ImageFolder files through DALI's ImageNet
  example pipeline on the CPU, in a venv that has DALI (``--dali-python``, $SHARDFEED_DALI_PYTHON or
  .venv-dali beside the checkout: ``WITH_DALI=1 tools/bench/install_peers.sh``); skipped without one;
- **FFCV**: not run. ffcv 1.0.2 is a source distribution only, and its build needs OpenCV 4 found by
  pkg-config and libturbojpeg, which pip cannot install ("RuntimeError: Could not find required package:
  opencv4" here); its row says so (or, where ffcv imports, that this benchmark has no FFCV pipeline).

Per core = images/s / cores busy (1 at 0 workers, the workers' count otherwise); torch runs one thread in
this process (as in a loader worker), so a 0-worker pass uses one core. Passes alternate, median of
--repeat; each pass counts every image and checks its shape.
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import statistics
import sys
import time

import numpy as np

BATCH = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.strip().split("\n\n")[0]
    parser.add_argument("--photos", default=None, help="folder of photographs (default: scikit-image's)")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--workers", default="0,2", help="comma-separated worker counts (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default="bench-results", help="folder for the results (default: %(default)s)")
    parser.add_argument("--dali-python", default=None, metavar="PYTHON",
                        help="an interpreter with NVIDIA DALI (default: $SHARDFEED_DALI_PYTHON, else .venv-dali "
                             "beside the checkout; \"none\" leaves DALI out)")


def _photos(given: str | None) -> list[str]:
    folder = given
    if folder is None:
        try:
            import skimage
        except ImportError as e:
            raise SystemExit("bench images: no --photos and scikit-image is not installed (pip download "
                             "--no-deps scikit-image, unzip skimage/data, pass --photos DIR)") from e
        folder = os.path.join(os.path.dirname(skimage.__file__), "data")
    from PIL import Image
    paths = [p for p in sorted(glob.glob(os.path.join(folder, "*"))) if p.lower().endswith((".jpg", ".png"))]
    photos = [p for p in paths if Image.open(p).mode == "RGB" and min(Image.open(p).size) >= 300]
    if not photos:
        raise SystemExit(f"bench images: no RGB photographs of 300 px or more in {folder}")
    return photos


def _make_jpegs(photos: list[str], n: int) -> list[bytes]:
    from PIL import Image
    rng = np.random.default_rng(0)
    images = [Image.open(p).convert("RGB") for p in photos]
    out = []
    for i in range(n):
        img = images[i % len(images)]
        w, h = img.size
        cw = int(w * rng.uniform(0.6, 1.0))
        ch = min(h, int(cw * 0.75))
        left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        crop = img.crop((left, top, left + cw, top + ch)).resize((500, 375), Image.BICUBIC)
        if rng.random() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        buf = io.BytesIO()
        crop.save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def _write(folder: str, jpegs: list[bytes]) -> dict:
    from shardfeed.formats import ShardWriter
    tar = os.path.join(folder, "tar")
    if not os.path.exists(os.path.join(tar, "index.arrow")):
        with ShardWriter(tar, format="tar", max_shard_samples=-(-len(jpegs) // 8)) as w:
            for i, j in enumerate(jpegs):
                w.write({"__key__": f"{i:08d}", "jpg": j, "cls": i % 1000})
    files = os.path.join(folder, "imagefolder")
    if not os.path.isdir(files):
        for i, j in enumerate(jpegs):
            d = os.path.join(files, f"{i % 1000:04d}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, f"{i:08d}.jpg"), "wb") as f:
                f.write(j)
    return {"tar": tar, "files": files}


class ImageFolderPIL:
    """ImageFolder's layout and reading in plain PIL, with the transform (module level: picklable)."""

    def __init__(self, root: str, transform):
        self.paths = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))
        self.transform = transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            data = f.read()
        return self.transform({"jpg": data})["jpg"], int(os.path.basename(os.path.dirname(self.paths[i])))


def _wds_map(transform):
    return lambda s: (transform({"jpg": s["jpg"]})["jpg"], int(s["cls"]))


MODES = {"exact": {"draft": False, "resize": "pil"}, "draft": {"draft": True, "resize": "pil"},
         "fast": {"draft": True, "resize": "torch"}}


def _batches(variant: str, where: dict, size: int, mode: str, workers: int):
    from shardfeed.loader.image_crops import RandomResizedCropFlip
    t = RandomResizedCropFlip(size, **MODES[mode])
    if variant == "shardfeed":
        from shardfeed.loader import Loader, ShardDataset
        with Loader(ShardDataset(where["tar"], shuffle="global", decode=False, transform=t), batch_size=BATCH,
                    num_workers=workers) as loader:
            for b in loader:
                yield b["jpg"]
        return
    import torch
    from torch.utils.data import DataLoader
    if variant == "imagefolder":
        for x, _ in DataLoader(ImageFolderPIL(where["files"], t), batch_size=BATCH, shuffle=True,
                               num_workers=workers, generator=torch.Generator().manual_seed(0)):
            yield x
        return
    import webdataset as wds
    urls = sorted(glob.glob(os.path.join(where["tar"], "*.tar")))
    ds = wds.WebDataset(urls, shardshuffle=len(urls), seed=0, empty_check=False).shuffle(1000).map(_wds_map(t))
    for x, _ in wds.WebLoader(ds.batched(BATCH, partial=True), batch_size=None, num_workers=workers):
        yield x


def _pass(variant, where, size, mode, workers, n) -> dict:
    t0 = time.perf_counter()
    count = 0
    for x in _batches(variant, where, size, mode, workers):
        shape = tuple(x.shape) if hasattr(x, "shape") else (len(x), *np.asarray(x[0]).shape)
        if shape[1:] != (3, size, size):
            return {"status": f"FAILED: batch of shape {shape}"}
        count += shape[0]
    if count != n:
        return {"status": f"FAILED: {count} images, expected {n}"}
    return {"status": "ok", "rate": count / (time.perf_counter() - t0)}


VARIANTS = [("shardfeed", 224, "exact"), ("shardfeed", 224, "draft"), ("shardfeed", 224, "fast"),
            ("shardfeed", 160, "fast"), ("shardfeed", 128, "fast"), ("imagefolder", 224, "exact"),
            ("webdataset", 224, "exact"), ("dali", 224, "exact"), ("ffcv", 224, "exact")]
LABELS = {"shardfeed": "shardfeed", "imagefolder": "ImageFolder + PIL DataLoader (torchvision's computation)",
          "webdataset": "webdataset", "dali": "DALI CPU pipeline (readers.file + image_random_crop)",
          "ffcv": "FFCV"}


def _dali_python(given: str | None) -> str | None:
    from shardfeed.tools.bench import fresh

    return None if given == "none" else fresh.venv_python("dali", given)


def _dali_pass(python: str | None, where: dict, size: int, workers: int, n: int) -> dict:
    from shardfeed.tools.bench import fresh
    if python is None:
        return {"status": "skipped: no venv with DALI (WITH_DALI=1 tools/bench/install_peers.sh makes .venv-dali; "
                          "or --dali-python / $SHARDFEED_DALI_PYTHON)"}
    job = {"root": where["files"], "size": size, "workers": workers, "n": n, "batch": BATCH}
    return fresh.run("shardfeed.tools.bench.images_dali:main", job, timeout=1800, python=python, by_path=True,
                     who="DALI's process")


def _ffcv_status() -> str:
    import importlib.util
    if importlib.util.find_spec("ffcv") is None:
        return ("skipped: FFCV does not install here (ffcv 1.0.2 is a source distribution only; its build needs "
                "OpenCV 4 through pkg-config and libturbojpeg: \"Could not find required package: opencv4\")")
    return "skipped: ffcv imports, but this benchmark has no FFCV pipeline (.beton writer + ffcv.Loader) yet"


def main(args: argparse.Namespace) -> int:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the fast mode's resize: one core at 0 workers, as in a loader worker
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace) -> int:
    out = os.path.abspath(args.out)
    photos = _photos(args.photos)
    data = os.path.join(out, "data", f"images-{args.samples}")
    os.makedirs(data, exist_ok=True)
    where = _write(data, _make_jpegs(photos, args.samples))
    workers = [int(w) for w in args.workers.split(",")]
    dali_py = _dali_python(getattr(args, "dali_python", None))
    runs: dict = {}
    for _ in range(args.repeat):
        for w in workers:
            for v in VARIANTS:
                try:
                    if v[0] == "dali":
                        r = _dali_pass(dali_py, where, v[1], w, args.samples)
                    elif v[0] == "ffcv":
                        r = {"status": _ffcv_status()}
                    else:
                        r = _pass(*v[:1], where, v[1], v[2], w, args.samples)
                except ImportError as e:
                    r = {"status": f"skipped: cannot import ({e})"}
                runs.setdefault((*v, w), []).append(r)
    rows = []
    for (v, size, mode, w), rs in runs.items():
        bad = next((r for r in rs if r["status"] != "ok"), None)
        rate = None if bad else statistics.median(r["rate"] for r in rs)
        rows.append({"variant": v, "size": size, "mode": mode, "workers": w, "status": bad["status"] if bad else "ok",
                     "images_per_s": rate, "per_core": rate / max(1, w) if rate else None})
    from shardfeed.tools.bench import results

    report = {"samples": args.samples, "photos": [os.path.basename(p) for p in photos], "repeat": args.repeat,
              "machine": results.machine(), "rows": rows}
    md = (f"`shardfeed bench images`: {args.samples:,} JPEGs (500x375, quality 90) cut from {len(photos)} "
          f"photographs ({', '.join(report['photos'])}), RandomResizedCrop + flip -> uint8 CHW in the workers, "
          f"batch {BATCH}, median of {args.repeat} passes; {report['machine']}.\n\n" + results.table(
              ["variant", "size", "mode", "workers", "images/s", "per core", "status"],
              [[LABELS[r["variant"]], r["size"], r["mode"] if r["variant"] not in ("dali", "ffcv") else "its own",
                r["workers"], results.cell(r["images_per_s"]), results.cell(r["per_core"]), r["status"]]
               for r in rows], "lrlrrrl") + "\n")
    results.write(out, {"bench_images.json": report, "bench_images.md": "# shardfeed bench images\n\n" + md})
    print(md)
    print(f"bench images: wrote {out}/bench_images.md and .json", file=sys.stderr)
    return 0 if all(r["status"] == "ok" or r["status"].startswith("skipped") for r in rows) else 1
