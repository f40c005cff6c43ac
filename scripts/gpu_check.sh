#!/usr/bin/env bash
# Everything horovodlike's GPU path is checked by on a machine with a GPU, in one run of about
# 7 minutes: builds and installs horovodlike over that machine's own PyTorch (no download), then
# runs each step under `timeout`, writing each step's raw output to a file of its own and going
# on past a failing step.
#
#   bash scripts/gpu_check.sh prepare     on a machine with the network and Horovod's suites:
#                                         fills .gpu_check/ (ignored by git) with what travels
#                                         with the checkout: Horovod's test suites, the commit,
#                                         the `mock` wheel those suites import, OpenSSL's headers,
#                                         and a core prebuilt for Python 3.12 (PREBUILT_PYTHON)
#   bash scripts/gpu_check.sh             on the GPU machine
#
# Environment: RESULTS (folder of the raw outputs, default gpu_check_out), ARCHIVE (also pack
# RESULTS into this .tgz after every step, so that a run cut short still leaves what it did),
# BUDGET (seconds for the whole run, default 450: a step gets what is left, never more),
# SUITE_SECONDS and SUITE2_SECONDS (Horovod's test_torch.py at 1 and 2 ranks, default 210
# and 150), ONLY
# (the steps to run, by number: ONLY="10 20" runs 10-... and 20-... after the build).
#
# Steps (docs/gpu.md): 1. the project's GPU tests (one rank on the GPU over NCCL, and 2 and 4
# ranks sharing it through host staging), and the stand-in tests; 2. Horovod's test_torch.py at
# 1 and 2 ranks (scripts/horovod_suites.py, batches as Horovod's CI runs it) and its tests named
# cuda/gpu through run_suite.sh, one job per test; 3. examples/pytorch_digits.py --cuda at 1 and
# 2 ranks; 4. benchmarks/allreduce.py --cuda at 1 and 2 ranks; 5. benchmarks/train_step.py
# --cuda at 1 rank. Steps 1-3 run side by side (they check results, not time); the timed steps
# 4 and 5 run alone after them. Each file starts with its command, the GPU (nvidia-smi -L) and
# the commit.
set -u
cd "$(dirname "$0")/.."
HERE=$(pwd)
PREPARED=.gpu_check

if [ "${1:-}" = prepare ]; then
  suites=${HOROVOD_TESTS:-../shared/horovod-tests}
  [ -d "$PREPARED" ] && chmod -R u+w "$PREPARED"
  rm -rf "$PREPARED" && mkdir -p "$PREPARED/wheels" "$PREPARED/openssl/include" \
    "$PREPARED/prebuilt"
  cp -r "$suites" "$PREPARED/horovod-tests" && chmod -R u+w "$PREPARED/horovod-tests"
  git rev-parse HEAD > "$PREPARED/commit"
  git diff --quiet HEAD -- src csrc || echo "(with uncommitted changes)" >> "$PREPARED/commit"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$PREPARED/wheels" mock \
    || echo "could not download mock: Horovod's suites will not import there"
  # For a machine without libssl-dev: the headers, linked against its own libcrypto.so.3.
  for dir in /usr/include/openssl /usr/include/*-linux-gnu/openssl; do
    [ -d "$dir" ] && cp -r "$dir" "$PREPARED/openssl/include/"
  done
  py=${PREBUILT_PYTHON:-python3.12}
  if command -v "$py" > /dev/null && "$py" -c "import pybind11" 2> /dev/null; then
    cmake -S . -B "$PREPARED/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DPython_EXECUTABLE="$(command -v "$py")" \
      -Dpybind11_DIR="$("$py" -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
      -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DGLOO_LIBRARY=GLOO_LIBRARY-NOTFOUND > /dev/null \
      && ninja -C "$PREPARED/build" > /dev/null \
      && cp "$PREPARED"/build/_core*.so "$PREPARED/prebuilt/" && rm -rf "$PREPARED/build"
  else
    echo "no $py with pybind11: no prebuilt core (the GPU machine must build it)"
  fi
  du -sh "$PREPARED"
  echo "prepared $PREPARED: carry it with the checkout"
  exit 0
fi

RESULTS=${RESULTS:-gpu_check_out}
ARCHIVE=${ARCHIVE:-}
BUDGET=${BUDGET:-450}
DEADLINE=$((SECONDS + BUDGET))
[ -n "${ONLY:-}" ] && ONLY="$ONLY 00 01 02"
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
COMMIT=$(tr '\n' ' ' < "$PREPARED/commit" 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)
GPU=$(nvidia-smi -L 2>/dev/null | head -1)
SUMMARY=$RESULTS/summary.txt
: > "$SUMMARY"

pack() {
  [ -n "$ARCHIVE" ] || return 0
  (
    command -v flock > /dev/null && flock 9
    tar czf "$ARCHIVE.part" -C "$RESULTS" --exclude=./.lock . 2>/dev/null && mv "$ARCHIVE.part" "$ARCHIVE"
  ) 9> "$RESULTS/.lock"
}

# step NAME SECONDS COMMAND...: the command's output, headed, in $RESULTS/NAME.txt; it gets
# SECONDS or what is left of the budget, whichever is less.
step() {
  local name=$1 limit=$2
  shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" ${name%%-*} "* ]]; then return; fi
  local file=$RESULTS/$name.txt start=$SECONDS left=$((DEADLINE - SECONDS))
  [ "$limit" -gt "$left" ] && limit=$left
  {
    echo "# command: $*"
    echo "# gpu: ${GPU:-none}"
    echo "# commit: $COMMIT"
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  load: $(cut -d' ' -f1-3 /proc/loadavg)  cores: $(nproc)"
  } > "$file"
  if [ "$limit" -lt 10 ]; then
    echo "# not run: the run's budget ($BUDGET s) is spent" >> "$file"
    echo "$name: not run (budget spent)" | tee -a "$SUMMARY"
    pack
    return
  fi
  timeout -k 10 "$limit" "$@" >> "$file" 2>&1
  local rc=$?
  echo "# exit: $rc after $((SECONDS - start)) s (limit $limit s)" >> "$file"
  echo "$name: exit $rc after $((SECONDS - start)) s" | tee -a "$SUMMARY"
  pack
}

step 00-environment 30 bash -c 'nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
  python3 -c "import sys, torch; print(sys.executable, sys.version.split()[0]); print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"nccl\", torch.cuda.nccl.version(), \"gpus\", torch.cuda.device_count())";
  python3 -m pip list 2>/dev/null | grep -iE "^(torch|nvidia-nccl|nvidia-cuda-runtime|numpy|scikit-build-core|pybind11|cloudpickle|mock|scikit-learn) ";
  ls /usr/include/openssl/evp.h; ldconfig -p | grep -E "libcrypto.so|libmpi.so" | head -4;
  python3 -c "import sysconfig, os; h = sysconfig.get_paths()[\"include\"]; print(\"Python.h\", os.path.exists(h + \"/Python.h\"))";
  gcc --version | head -1; cmake --version | head -1; nproc; free -g | head -2'

# Build: pip over this machine's PyTorch; OpenSSL's headers from .gpu_check when the system has
# none. The source tree gets the same core, so that tests and benchmarks run from the checkout
# import what was built. When the build fails, the core prebuilt for this Python is used.
if [ ! -f /usr/include/openssl/evp.h ] && [ -d "$PREPARED/openssl/include/openssl" ]; then
  crypto=$(ldconfig -p | grep -oE '/[^ ]*libcrypto\.so\.3$' | head -1)
  export CMAKE_ARGS="-DOPENSSL_INCLUDE_DIR=$HERE/$PREPARED/openssl/include -DOPENSSL_CRYPTO_LIBRARY=$crypto"
  echo "build: OpenSSL's headers from $PREPARED ($crypto)" | tee -a "$SUMMARY"
fi
ls "$PREPARED"/wheels/*.whl > /dev/null 2>&1 && \
  step 01-wheels 60 python3 -m pip install --no-index --no-deps --quiet "$PREPARED"/wheels/*.whl
export PIP_BREAK_SYSTEM_PACKAGES=1
step 01-build 240 python3 -m pip install --no-build-isolation --no-deps --verbose .
rm -f src/horovodlike/_core*.so
core=$(cd / && python3 -c "import horovodlike._core as c; print(c.__file__)" 2>> "$RESULTS/01-build.txt")
if [ -n "$core" ]; then
  cp "$core" src/horovodlike/
  echo "build: installed $core" | tee -a "$SUMMARY"
else
  cp "$PREPARED"/prebuilt/_core*.so src/horovodlike/ 2>/dev/null \
    && echo "build: failed; using the prebuilt core" | tee -a "$SUMMARY"
  export PYTHONPATH=$HERE/src${PYTHONPATH:+:$PYTHONPATH}
  mkdir -p "$PREPARED/bin"
  printf '#!/bin/sh\nexec python3 -m horovodlike.runner.launch "$@"\n' > "$PREPARED/bin/horovodlikerun"
  chmod +x "$PREPARED/bin/horovodlikerun"
  export PATH=$HERE/$PREPARED/bin:$PATH
fi
step 02-check-build 30 horovodlikerun --check-build

# 1-3: correctness, side by side. A test that hangs fails after 25 s with where it was
# (pytest-timeout, where installed), instead of holding its batch.
HANG=""
python3 -c "import pytest_timeout" 2> /dev/null && HANG="--timeout=25"
SUITE_DIR=$PREPARED/horovod-tests
step 10-torch-cuda-tests 180 python3 -m pytest -v -rs -p no:cacheprovider tests/test_torch_device.py &
step 11-standin-tests 150 python3 -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py \
  tests/test_gpu_standins_*.py &
# At 1 rank, the suite's process-set tests cannot pass (each adds a set of rank 0, which the
# global set already is: Horovod refuses such a duplicate too) and test_horovod_join_allreduce
# asserts that join returns a rank other than the first to join; the process-set tests are left
# out there, so that the rest of the suite runs to its end within the budget. At 2 ranks on one
# GPU, the suite's CUDA tests place rank r's tensors on cuda:r, a device rank 1 does not have.
PYTEST_ADDOPTS=$HANG step 20-horovod-test-torch-np1 "${SUITE_SECONDS:-210}" python3 scripts/horovod_suites.py "$SUITE_DIR" test_torch.py \
  --np 1 -k "not process_sets" --timeout 40 --check --progress --record "$RESULTS/20-record.txt" &
PYTEST_ADDOPTS=$HANG step 21-horovod-test-torch-np2 "${SUITE2_SECONDS:-150}" python3 scripts/horovod_suites.py "$SUITE_DIR" test_torch.py \
  --np 2 --timeout 40 --check --progress --record "$RESULTS/21-record.txt" &
(
  export SUITE_K="cuda or gpu" TEST_TIMEOUT=60 PYTEST_ADDOPTS=$HANG
  # The suite's copy lives outside the checkout: inside it, pytest would take the checkout as
  # its root, name the tests by paths that also match "gpu", and run none of them.
  for np in 1 2; do
    work=${TMPDIR:-/tmp}/hvdl_gpu_check_suite_np$np
    SUITE_WORK=$work step 2$((np + 1))-run-suite-gpu-named-np$np 90 \
      bash "$SUITE_DIR/run_suite.sh" test_torch.py $np
    cp "$work/hvdsuite_test_torch/suite.log" "$RESULTS/run-suite-gpu-named-np$np.log" 2>/dev/null
  done
) &
(
  step 30-digits-np1 90 horovodlikerun -np 1 python3 examples/pytorch_digits.py --cuda
  step 31-digits-np2 90 horovodlikerun -np 2 python3 examples/pytorch_digits.py --cuda
) &
wait
# What a step cut at its limit left running (a launcher's ranks in sessions of their own) would
# load the timed steps.
pkill -9 -f "pytest|horovodlikerun|horovodlike[.]runner|horovod_suites" 2> /dev/null
sleep 1

# 4-5: time, alone on the machine.
step 40-allreduce-np1 100 python3 benchmarks/allreduce.py --cuda --np 1 --repeat 3 \
  --only hvdl-cuda,torch-nccl --sizes 4K,64K,1M,16M,256M --json "$RESULTS/40-allreduce-np1.json"
step 41-allreduce-np2 100 python3 benchmarks/allreduce.py --cuda --np 2 --repeat 3 \
  --only hvdl-cuda,torch-gloo-cuda --sizes 4K,64K,1M,16M,64M --json "$RESULTS/41-allreduce-np2.json"
step 50-train-step-np1 90 python3 benchmarks/train_step.py --cuda --np 1 --repeat 3 \
  --json "$RESULTS/50-train-step-np1.json"

echo "done in $SECONDS s: $SUMMARY" | tee -a "$SUMMARY"
pack
