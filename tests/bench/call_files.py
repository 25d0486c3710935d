"""An end-to-end call's files as ``bench/gpu_e2e.sh`` writes them, for the log readers' tests."""

import io
import json
import tarfile
from pathlib import Path


def write_call(folder: Path, results: dict, logs: dict[str, str]) -> tuple[Path, Path]:
    """``r.json`` (the results) and ``r_logs.tar.gz`` (each log under ``./<name>``)."""
    results_path, logs_path = folder / "r.json", folder / "r_logs.tar.gz"
    results_path.write_text(json.dumps(results))
    with tarfile.open(logs_path, "w:gz") as tar:
        for name, text in logs.items():
            data = text.encode()
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return results_path, logs_path
