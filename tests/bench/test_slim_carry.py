"""bench/slim_carry.py drops only the folders no server reads, and the wheel still installs."""

import subprocess
import sys
import zipfile

import pytest

from bench import slim_carry


def _wheel(path, files, dist="pycountry-1.0"):
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        record = "".join(f"{name},sha256=x,{len(text)}\n" for name, text in files.items())
        z.writestr(f"{dist}.dist-info/RECORD", record + f"{dist}.dist-info/RECORD,,\n")


def test_a_wheel_loses_its_translations_and_tests_and_keeps_its_code(tmp_path):
    wheel = tmp_path / "pycountry-1.0-py3-none-any.whl"
    _wheel(wheel, {"pycountry/__init__.py": "NAME = 'pycountry'\n",
                   "pycountry/databases/iso639-3.json": "{}\n",
                   "pycountry/locales/de/LC_MESSAGES/iso639-3.mo": "x" * 5000,
                   "pycountry/tests/test_general.py": "",
                   "pycountry-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: pycountry\nVersion: 1.0\n",
                   "pycountry-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"})
    other = tmp_path / "other-1.0-py3-none-any.whl"
    other.write_bytes(b"not touched")
    assert slim_carry.main([str(tmp_path)]) == 0
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "pycountry/__init__.py" in names and "pycountry/databases/iso639-3.json" in names
    assert not any(n.startswith(("pycountry/locales/", "pycountry/tests/")) for n in names)
    record = zipfile.ZipFile(wheel).read("pycountry-1.0.dist-info/RECORD").decode()
    assert "locales" not in record and "pycountry/__init__.py" in record
    assert other.read_bytes() == b"not touched"
    assert slim_carry.slim_wheel(wheel, slim_carry.UNUSED["pycountry-"]) == 0  # slim already
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                           str(target), str(wheel)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (target / "pycountry" / "__init__.py").is_file()


def test_mistral_common_loses_only_its_tekken_tokenizer_files(tmp_path):
    wheel = tmp_path / "mistral_common-1.0-py3-none-any.whl"
    _wheel(wheel, {"mistral_common/__init__.py": "",
                   "mistral_common/data/tekken_240911.json": "x" * 5000,
                   "mistral_common/data/mistral_instruct_tokenizer_241114.model.v7": "y"},
           dist="mistral_common-1.0")
    assert slim_carry.main([str(tmp_path)]) == 0
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "mistral_common/__init__.py" in names
    assert "mistral_common/data/mistral_instruct_tokenizer_241114.model.v7" in names
    assert not any("tekken" in n for n in names)


def test_zstandard_loses_its_cffi_backend_and_keeps_the_c_one(tmp_path):
    wheel = tmp_path / "zstandard-1.0-cp312-cp312-manylinux2014_x86_64.whl"
    _wheel(wheel, {"zstandard/__init__.py": "", "zstandard/backend_c.cpython-312-x86_64-linux-gnu.so": "c" * 5000,
                   "zstandard/_cffi.cpython-312-x86_64-linux-gnu.so": "f" * 5000,
                   "zstandard/backend_cffi.py": "", "zstandard/py.typed": ""},
           dist="zstandard-1.0")
    assert slim_carry.main([str(tmp_path)]) == 0
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"zstandard/__init__.py", "zstandard/backend_c.cpython-312-x86_64-linux-gnu.so"} <= names
    assert not any("cffi" in n for n in names)


def test_a_folder_that_is_not_there_or_a_corrupt_wheel_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        slim_carry.main([str(tmp_path / "missing")])
    (tmp_path / "pycountry-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    with pytest.raises(SystemExit):
        slim_carry.main([str(tmp_path)])
    assert "not a readable wheel" in capsys.readouterr().err


def test_torch_memory_saver_keeps_its_cuda_builds_and_loses_the_rocm_ones(tmp_path):
    wheel = tmp_path / "torch_memory_saver-1.0-cp39-abi3-manylinux2014_x86_64.whl"
    builds = [f"torch_memory_saver_hook_mode_{mode}{cuda}.abi3.so"
              for mode in ("preload", "torch") for cuda in ("", "_cu12", "_cu13")]
    _wheel(wheel, {"torch_memory_saver/__init__.py": "", **{name: "s" * 5000 for name in builds}},
           dist="torch_memory_saver-1.0")
    assert slim_carry.main([str(tmp_path)]) == 0
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {n for n in builds if "_cu1" in n} <= names and "torch_memory_saver/__init__.py" in names
    assert not names & {"torch_memory_saver_hook_mode_preload.abi3.so", "torch_memory_saver_hook_mode_torch.abi3.so"}
