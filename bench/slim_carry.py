"""Make the carried SGLang packages (``.sgc/whl``) smaller, keeping every module they import.

The GPU machine gets the working tree and ``.sgc`` together, within a size limit, and the
results files of ``bench/results`` grow with every benchmark call. pycountry's wheel is the
largest of the carried ones (8 MB, 22 MB unpacked) and is imported by the servers (SGLang ->
gguf -> mistral_common -> pydantic_extra_types), but only for its code and databases: its
translations (``pycountry/locales``) and tests are never read. mistral_common's wheel (6.6 MB)
carries two Tekken tokenizer files of 2.6 MB each (``mistral_common/data/tekken_*.json``), read
only to load those Mistral tokenizers, which no benchmark model uses. zstandard's wheel holds two
backends of 11-12 MB each: ``import zstandard`` loads the C one (``backend_c``) and reads the cffi
one (``_cffi``, ``backend_cffi.py``) only when ``PYTHON_ZSTANDARD_IMPORT_POLICY`` asks for it,
which nothing here sets. torch_memory_saver's wheel holds six builds of its two hook libraries
(2.6 MB): one for each of CUDA 12 and 13 (``_cu12``, ``_cu13``) and an unsuffixed one that it
picks only on ROCm; none is loaded unless ``--enable-memory-saver`` is set. This rewrites such wheels
without those folders (and without their ``RECORD`` lines), in place::

    python bench/slim_carry.py .sgc/whl
"""

from __future__ import annotations

import argparse
import csv
import io
import zipfile
from collections.abc import Sequence
from pathlib import Path

# wheel name prefix -> folders inside the wheel that no server reads
UNUSED = {
    "pycountry-": ("pycountry/locales/", "pycountry/tests/"),
    "mistral_common-": ("mistral_common/data/tekken_",),
    "zstandard-": ("zstandard/_cffi.", "zstandard/backend_cffi.py"),
    "torch_memory_saver-": ("torch_memory_saver_hook_mode_preload.abi3.so",
                            "torch_memory_saver_hook_mode_torch.abi3.so"),
}


def slim_wheel(wheel: Path, drop: Sequence[str]) -> int:
    """Rewrite ``wheel`` without the members under ``drop``; the bytes saved (0: nothing to drop)."""
    with zipfile.ZipFile(wheel) as zin:
        members = zin.infolist()
        keep = [m for m in members if not m.filename.startswith(tuple(drop))]
        if len(keep) == len(members):
            return 0
        kept = {m.filename for m in keep}
        before = wheel.stat().st_size
        tmp = wheel.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
            for m in keep:
                data = zin.read(m.filename)
                if m.filename.endswith(".dist-info/RECORD"):
                    rows = [r for r in csv.reader(io.StringIO(data.decode())) if r and r[0] in kept]
                    out = io.StringIO()
                    csv.writer(out, lineterminator="\n").writerows(rows)
                    data = out.getvalue().encode()
                zout.writestr(m, data)
    tmp.replace(wheel)
    return before - wheel.stat().st_size


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wheels", type=Path, help="the folder of carried wheels (.sgc/whl)")
    args = p.parse_args(argv)
    if not args.wheels.is_dir():
        p.error(f"{args.wheels} is not a folder of wheels")
    for wheel in sorted(args.wheels.glob("*.whl")):
        for prefix, drop in UNUSED.items():
            if wheel.name.startswith(prefix):
                try:
                    saved = slim_wheel(wheel, drop)
                except zipfile.BadZipFile as exc:
                    p.error(f"{wheel} is not a readable wheel ({exc}): rebuild .sgc")
                print(f"{wheel.name}: {saved / 2**20:.1f} MiB smaller" if saved else f"{wheel.name}: already slim")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
