"""The lab's dataset: "lab-shapes", a synthetic, deterministic 10-class image
classification set written as JPEG files in torchvision ImageFolder layout
(``root/train/<class>/<NNNNN>.jpg``, ``root/val/...``), the course's stand-in for
ImageNet so that nothing has to be downloaded. Each class is a shape or pattern
family drawn with random colours, position, scale and rotation on a noisy
background, so a network has to learn shape rather than colour; images are larger
than the training resolution so that decoding and resizing cost what they cost on
real data. ``ensure()`` creates the set once and checks it cheaply afterwards,
``verify()`` checks every file against the sha256 sums in ``manifest.json``,
``load_rgb()`` turns undecodable files into a ``CorruptImageError`` that names the
file, and ``open_split()`` opens this set, any other ImageFolder tree, or a
CIFAR-10 copy already on disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from PIL import Image, ImageFilter

if TYPE_CHECKING:
    from torch.utils.data import Dataset

GENERATOR_VERSION = "lab-shapes-1"  # bump whenever the drawing code changes the pixels
FORMAT_VERSION = 1
CLASSES = ("0-circle", "1-square", "2-triangle", "3-hstripes", "4-vstripes",
           "5-cross", "6-ring", "7-checkerboard", "8-diagonal-stripes", "9-dots")
SPLITS = {"train": 0, "val": 1}  # split id feeds the RNG seed, so it must never change
DEFAULTS: dict[str, Any] = dict(seed=0, train_per_class=500, val_per_class=100,
                                source_size=160, quality=90)
REGENERATE_HINT = "run `python -m labsupport data` to regenerate the lab dataset"


class CorruptImageError(RuntimeError):
    """An image file that cannot be decoded; the message names the file."""


def _cells(t: np.ndarray, period: float) -> np.ndarray:
    # floor(t / period) as integers; the offset keeps values positive so truncation
    # is floor (much faster than np.floor/np.mod on floats).
    return (t * np.float32(1.0 / period) + np.float32(64.0)).astype(np.int32)


def _shape_mask(cls: int, rng: np.random.Generator, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # Coordinates span [-1, 1], so every size below is relative to the image and the
    # same class looks the same at any source_size. Only + * sqrt are used per pixel
    # (exactly rounded in IEEE arithmetic), so bytes do not depend on the CPU's SIMD
    # routines (np.sin/np.exp may differ in the last bit between machines).
    # Stripes keep their direction (a turned horizontal stripe would be a diagonal one).
    deg = {3: rng.uniform(-10, 10), 4: rng.uniform(80, 100),
           8: rng.uniform(35, 55) + 90 * rng.integers(2)}.get(cls, rng.uniform(0, 360))
    c, s = math.cos(math.radians(deg)), math.sin(math.radians(deg))
    cx, cy, r = rng.uniform(-0.25, 0.25), rng.uniform(-0.25, 0.25), rng.uniform(0.45, 0.7)
    u, v = (x - cx) * c + (y - cy) * s, (y - cy) * c - (x - cx) * s
    window = (np.abs(u) < rng.uniform(0.45, 0.85)) & (np.abs(v) < rng.uniform(0.45, 0.85))
    if cls == 0:  # circle (slightly elliptic)
        return np.sqrt(u * u + (v * rng.uniform(1.0, 1.3)) ** 2) < r
    if cls == 1:  # square
        return np.maximum(np.abs(u), np.abs(v)) < 0.8 * r
    if cls == 2:  # equilateral triangle: inside three half-planes 120 degrees apart
        normals = [(math.cos(a), math.sin(a)) for a in (math.pi / 2 + k * 2 * math.pi / 3 for k in range(3))]
        return np.logical_and.reduce([u * nx + v * ny < 0.55 * r for nx, ny in normals])
    if cls in (3, 4, 8):  # stripes; the period stays >= 4 px at 32 px input
        return window & (_cells(v, rng.uniform(0.25, 0.4) / 2) % 2 == 0)  # half-period cells
    if cls == 5:  # cross (a plus or an X, depending on the rotation)
        t = r * rng.uniform(0.25, 0.4)
        return ((np.abs(u) < t) & (np.abs(v) < r)) | ((np.abs(v) < t) & (np.abs(u) < r))
    if cls == 6:  # ring
        d = np.sqrt(u * u + v * v)
        return (d < r) & (d > r * rng.uniform(0.55, 0.75))
    if cls == 7:  # checkerboard
        cell = rng.uniform(0.2, 0.32)
        return window & ((_cells(u, cell) + _cells(v, cell)) % 2 == 0)
    mask = np.zeros_like(x, dtype=bool)  # 9: dots scattered over the image
    for _ in range(rng.integers(5, 11)):
        px, py, pr = rng.uniform(-0.8, 0.8), rng.uniform(-0.8, 0.8), rng.uniform(0.09, 0.15)
        mask |= np.sqrt((x - px) ** 2 + (y - py) ** 2) < pr
    return mask


def _render(cls: int, rng: np.random.Generator, size: int) -> Image.Image:
    # Background: a dark, smooth random colour field (pixel noise is added below), so
    # no flat colour or clean edge gives the class away. The shape is always lighter
    # than the background: with random contrast polarity too, ResNet-18 learns
    # nothing in the first few hundred steps, which is all the lab can afford.
    base = rng.uniform(0, 110, 3)
    coarse = np.clip(base + rng.uniform(-40, 40, (4, 4, 3)), 0, 255).astype(np.uint8)
    bg = Image.fromarray(coarse, "RGB").resize((size, size), Image.Resampling.BILINEAR)
    fg = rng.uniform(150, 255, 3)  # random hue: colour says nothing about the class
    ax = (np.arange(size, dtype=np.float32) + 0.5) * (2.0 / size) - 1.0
    x, y = np.meshgrid(ax, ax)
    alpha = _shape_mask(cls, rng, x, y).astype(np.float32)[..., None] * rng.uniform(0.7, 1.0)
    img = np.asarray(bg, dtype=np.float32) * (1 - alpha) + fg.astype(np.float32) * alpha
    # Uniform integer noise: several times cheaper to draw than Gaussian noise.
    img += rng.integers(-128, 128, img.shape, dtype=np.int16) * np.float32(rng.uniform(0.05, 0.25))
    out = Image.fromarray(np.clip(img + 0.5, 0, 255).astype(np.uint8), "RGB")
    return out.filter(ImageFilter.BoxBlur(rng.uniform(0.0, 1.0) * size / 160))  # soften edges


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _params(**params: Any) -> dict[str, Any]:
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown dataset parameter(s): {sorted(unknown)}")
    return {**DEFAULTS, **params, "classes": list(CLASSES), "generator": GENERATOR_VERSION}


def generate(root: Path, *, seed: int = 0, train_per_class: int = 500, val_per_class: int = 100,
             source_size: int = 160, quality: int = 90, progress: bool = True) -> Path:
    """Write the lab-shapes dataset and its manifest into ``root``; return ``root``."""
    from tqdm.auto import tqdm  # imported here so importing the module stays cheap

    root = Path(root)
    params = _params(seed=seed, train_per_class=train_per_class, val_per_class=val_per_class,
                     source_size=source_size, quality=quality)
    counts = {"train": train_per_class, "val": val_per_class}
    files: dict[str, str] = {}
    sizes: dict[str, int] = {}
    with tqdm(total=sum(counts.values()) * len(CLASSES), desc="lab-shapes", unit="img",
              disable=not progress) as bar:
        for split, split_id in SPLITS.items():
            for cls, name in enumerate(CLASSES):
                folder = root / split / name
                folder.mkdir(parents=True, exist_ok=True)
                for i in range(counts[split]):
                    # One RNG per image: any file can be regenerated on its own.
                    rng = np.random.default_rng([seed, split_id, cls, i])
                    buf = io.BytesIO()
                    _render(cls, rng, source_size).save(buf, format="JPEG", quality=quality,
                                                        subsampling=2, optimize=False, progressive=False)
                    data = buf.getvalue()
                    rel = f"{split}/{name}/{i:05d}.jpg"
                    (root / rel).write_bytes(data)
                    files[rel], sizes[rel] = hashlib.sha256(data).hexdigest(), len(data)
                    bar.update()
    manifest = {"format": FORMAT_VERSION, "params": params, "files": files, "sizes": sizes,
                "pillow": Image.__version__, "numpy": np.__version__}
    # The manifest is written last (atomically): a dataset without it is incomplete.
    tmp = root / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=0, sort_keys=True))
    os.replace(tmp, root / "manifest.json")
    return root


def _read_manifest(root: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(root) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def verify(root: Path | str) -> list[str]:
    """Hash every file listed in ``root/manifest.json``; return the problems (empty = OK).
    ``python -m labsupport data --verify`` runs it (``ensure(full_check=True)``)."""
    root = Path(root)
    manifest = _read_manifest(root)
    if manifest is None or "files" not in manifest:
        return [f"{root / 'manifest.json'}: missing or unreadable"]
    problems = []
    for rel, digest in manifest["files"].items():
        path = root / rel
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif _sha256(path) != digest:
            problems.append(f"{path}: sha256 mismatch")
    return problems


def _looks_intact(root: Path, manifest: dict[str, Any]) -> bool:
    # Fast check (one stat per file, well under a second for 6000 files): catches
    # deleted and truncated files; verify() is the thorough version.
    try:
        return all((root / rel).stat().st_size == n for rel, n in manifest["sizes"].items())
    except (OSError, KeyError, AttributeError):
        return False


def default_root() -> Path:
    """Where the lab dataset lives (:func:`labsupport.paths.data_root`)."""
    from .paths import data_root

    return data_root()


def ensure(root: Path | str | None = None, *, full_check: bool = False, progress: bool = True,
           **params: Any) -> Path:
    """Return the root of an intact lab dataset with these parameters, generating it if needed.

    A root holding other data (an ImageFolder tree with other classes, or CIFAR-10) is
    returned untouched, so that LAB_DATA can point at any dataset.
    """
    chosen = root is not None or bool(os.environ.get("LAB_DATA"))  # not the default location
    root = Path(root) if root is not None else default_root()
    wanted = _params(**params)
    # A lab-shapes set someone chose (LAB_DATA or a root, e.g. a small one for tests) is used as
    # it is, whatever its size; only the default location is kept at the default parameters.
    any_size = chosen and not params
    if _ready(root, wanted, any_size, full_check):
        return root
    # Two processes may get here at once (two notebooks started together, or two test workers):
    # one generates, the other waits for it and then finds the dataset intact.
    with _generating(root):
        return _generate_unless_ready(root, wanted, any_size, full_check, progress)


def _ready(root: Path, wanted: dict, any_size: bool, full_check: bool) -> bool:
    """True if ``root`` holds an intact lab-shapes set with these parameters (any, if ``any_size``)."""
    manifest = _read_manifest(root)
    return (_ours(manifest) and _looks_intact(root, manifest) and (manifest["params"] == wanted or any_size)
            and not (full_check and verify(root)))


def _ours(manifest) -> bool:
    """True for the manifest of a lab-shapes set (one this module generated)."""
    return isinstance(manifest, dict) and str(manifest.get("params", {}).get("generator", "")).startswith("lab-shapes")


@contextlib.contextmanager
def _generating(root: Path):
    """Held while a dataset is generated at ``root``: an exclusive lock on a file beside it (POSIX;
    elsewhere no lock, as before)."""
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    with open(root.with_name(f".{root.name}.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _generate_unless_ready(root: Path, wanted: dict, any_size: bool, full_check: bool, progress: bool) -> Path:
    """ensure()'s work once it holds the lock: the dataset may be ready now (another process
    generated it while this one waited); if not, generate it, unless ``root`` is someone else's."""
    if _ready(root, wanted, any_size, full_check):
        return root
    if not _ours(_read_manifest(root)) and root.is_dir() and any(root.iterdir()):
        train = root / "train"
        if (root / "cifar-10-batches-py").is_dir() or (
                train.is_dir() and sorted(p.name for p in train.iterdir() if p.is_dir()) != list(CLASSES)):
            return root  # someone's own dataset: not ours to check or regenerate
        if not train.is_dir():
            # Only ever delete what we made (or what a direct generate() left half done).
            raise RuntimeError(f"{root} is neither the lab dataset nor an ImageFolder tree with "
                               "train/; refusing to overwrite it. Delete it or point LAB_DATA elsewhere.")
    # Build next to the target and rename into place, so an interrupted run never
    # leaves a half-written dataset at `root` that could pass for a complete one.
    tmp, old = (root.with_name(f".{root.name}.{tag}-{os.getpid()}") for tag in ("tmp", "old"))
    shutil.rmtree(tmp, ignore_errors=True)
    generate(tmp, progress=progress, **{k: wanted[k] for k in DEFAULTS})
    if root.exists():
        root.rename(old)
    tmp.rename(root)
    shutil.rmtree(old, ignore_errors=True)
    return root


def _jpeg_complete(data: bytes) -> bool:
    # Walk the JPEG markers up to EOI. libjpeg only *warns* about corrupt entropy
    # data, so a file whose tail was overwritten can decode "fine" into garbage
    # pixels; garbage almost never forms a valid marker sequence ending in EOI.
    i = 2  # after SOI
    while i + 1 < len(data):
        if data[i] != 0xFF:
            return False
        marker = data[i + 1]
        if marker == 0xD9:  # EOI; anything after it is allowed (some cameras append data)
            return True
        if marker == 0xFF or 0xD0 <= marker <= 0xD7 or marker == 0x01:  # fill byte, RSTn, TEM
            i += 1 if marker == 0xFF else 2
            continue
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
        if marker == 0xDA:  # SOS: entropy-coded data runs to the next FF that is not FF00/RSTn
            while True:
                j = data.find(b"\xff", i)
                if j < 0 or j + 1 >= len(data):
                    return False
                if data[j + 1] == 0 or 0xD0 <= data[j + 1] <= 0xD7:
                    i = j + 2
                else:
                    i = j
                    break
    return False


def load_rgb(path: str | Path) -> Image.Image:
    """Open and fully decode an image as RGB, raising CorruptImageError if that fails."""
    try:
        data = Path(path).read_bytes()
        with Image.open(io.BytesIO(data)) as img:
            # load() decodes now (not lazily later); with PIL's default
            # LOAD_TRUNCATED_IMAGES=False it raises on truncated files.
            img.load()
            if img.format == "JPEG" and not _jpeg_complete(data):
                raise OSError("JPEG data is corrupt (no valid marker sequence up to EOI)")
            return img.convert("RGB")
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise CorruptImageError(
            f"cannot decode image file {path} ({exc}). Delete it and {REGENERATE_HINT}, "
            "or remove it from your own dataset.") from exc


def open_split(root: Path | str, split: str, transform: Callable | None = None) -> Dataset:
    """Open one split of the lab dataset, any ImageFolder tree, or CIFAR-10 on disk.

    For CIFAR-10, "train" is its training set and any other split its test set.
    """
    from torchvision import datasets  # imported here: torchvision is slow to import

    root = Path(root)
    if (root / "cifar-10-batches-py").is_dir():
        return datasets.CIFAR10(root, train=(split == "train"), download=False, transform=transform)
    if not (root / split).is_dir():
        raise FileNotFoundError(
            f"no '{split}' folder in {root}. Expected an ImageFolder layout "
            f"{root}/{split}/<class name>/<image file> (or a CIFAR-10 'cifar-10-batches-py' "
            f"folder in {root}). To create the lab dataset run `python -m labsupport data` "
            "(or call labsupport.dataset.ensure()).")
    return datasets.ImageFolder(root / split, transform=transform, loader=ByName(load_rgb))


class ByName:
    """A labsupport function that pickles as its importable name, ``labsupport.<module>.<name>``.

    DataLoader workers started with ``spawn`` (the default on macOS and Windows) unpickle the
    dataset, and with it its loader function, by module name. The graded checks measure with a
    private copy of labsupport (:func:`labsupport.grading.fresh`, module ``_labsupport_graded_N``)
    that a new process cannot import, so its functions are sent by the installed package's name.
    """

    def __init__(self, fn: Callable):
        self.fn = fn
        self.name = "labsupport." + fn.__module__.split(".", 1)[1] + "." + fn.__qualname__

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __reduce__(self):
        import pydoc

        return pydoc.locate, (self.name,)
