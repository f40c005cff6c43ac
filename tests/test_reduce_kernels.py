"""The elementwise kernels against reference implementations written differently (every half
and bfloat16 bit pattern, every dtype x op, aligned and misaligned sizes). Compiled from the same
sources as the core."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler")
def test_reduce_kernels_selftest(tmp_path):
    binary = tmp_path / "reduce_selftest"
    subprocess.run(["g++", "-O2", "-std=c++17", f"-I{REPO / 'csrc' / 'reduce'}",
                    str(REPO / "csrc" / "reduce" / "reduce.cc"),
                    str(REPO / "csrc" / "reduce" / "scale.cc"),
                    str(REPO / "tests" / "native" / "reduce_selftest.cc"), "-o", str(binary)],
                   check=True, capture_output=True, text=True)
    result = subprocess.run([str(binary), "--quick"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 failures" in result.stdout and "PASS" in result.stdout, result.stdout
