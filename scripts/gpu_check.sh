#!/usr/bin/env bash
# Everything horovodlike's GPU path is checked by on a machine with a GPU, in one run of about
# 8 minutes: builds and installs horovodlike over that machine's own PyTorch (no download), then
# runs each step under `timeout`, writing each step's raw output to a file of its own and going
# on past a failing step.
#
#   bash scripts/gpu_check.sh prepare        on the build machine: copies Horovod's test_torch.py
#                                            suite and the commit id into .gpu_check/ (ignored by
#                                            git), to travel with the checkout
#   OUT=/some/folder bash scripts/gpu_check.sh   on the GPU machine (OUT defaults to gpu_check_out)
#
# Steps (docs/gpu.md): 1. the project's GPU tests (one rank per GPU over NCCL, and 2 and 4 ranks
# sharing a GPU through host staging; the stand-in tests too); 2. Horovod's test_torch.py at 1
# and 2 ranks; 3. examples/pytorch_digits.py --cuda at 1 and 2 ranks; 4. benchmarks/allreduce.py
# --cuda at 1 and 2 ranks; 5. benchmarks/train_step.py --cuda at 1 rank. Each file starts with
# its command, the GPU (nvidia-smi -L) and the commit.
set -u
cd "$(dirname "$0")/.."
HERE=$(pwd)
PREPARED=.gpu_check

if [ "${1:-}" = prepare ]; then
  suites=${HOROVOD_TESTS:-../shared/horovod-tests}
  rm -rf "$PREPARED" && mkdir -p "$PREPARED"
  cp -r "$suites" "$PREPARED/horovod-tests"
  git rev-parse HEAD > "$PREPARED/commit"
  git diff --quiet HEAD || echo "(with uncommitted changes)" >> "$PREPARED/commit"
  echo "prepared $PREPARED: carry it with the checkout"
  exit 0
fi

OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
COMMIT=$(tr '\n' ' ' < "$PREPARED/commit" 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)
GPU=$(nvidia-smi -L 2>/dev/null | head -1)
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"

# step NAME SECONDS COMMAND...: the command's output, headed, in $OUT/NAME.txt.
step() {
  local name=$1 limit=$2
  shift 2
  local file=$OUT/$name.txt start=$SECONDS
  {
    echo "# command: $*"
    echo "# gpu: ${GPU:-none}"
    echo "# commit: $COMMIT"
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
  } > "$file"
  timeout -k 10 "$limit" "$@" >> "$file" 2>&1
  local rc=$?
  echo "# exit: $rc after $((SECONDS - start)) s" >> "$file"
  echo "$name: exit $rc after $((SECONDS - start)) s" | tee -a "$SUMMARY"
}

step 00-environment 60 bash -c 'nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
  python3 -c "import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"nccl\", torch.cuda.nccl.version(), \"gpus\", torch.cuda.device_count())";
  python3 -m pip list 2>/dev/null | grep -iE "^(torch|nvidia-nccl|nvidia-cuda-runtime|numpy) "'
step 01-build 300 python3 -m pip install --no-build-isolation --no-deps --quiet .
step 02-check-build 60 horovodlikerun --check-build

# 1. The project's tests of the GPU path.
step 10-torch-cuda-tests 240 python3 -m pytest -q -rs tests/test_torch_device.py
step 11-standin-tests 120 python3 -m pytest -q -rs tests/test_gpu.py tests/test_gpu_standins_*.py

# 2. Horovod's own test_torch.py, its tests that use CUDA when it is available.
SUITE_DIR=$PREPARED/horovod-tests
export SUITE_WORK=$HERE/$OUT/suites TEST_TIMEOUT=60
export SUITE_K=${SUITE_K:-"cuda or gpu or allreduce or allgather or broadcast or alltoall or reducescatter"}
mkdir -p "$SUITE_WORK"
step 20-horovod-test-torch-np1 150 bash "$SUITE_DIR/run_suite.sh" test_torch.py 1
step 21-horovod-test-torch-np2 150 bash "$SUITE_DIR/run_suite.sh" test_torch.py 2

# 3. Training on the GPU: one rank over NCCL, two sharing it (staged).
step 30-digits-np1 90 horovodlikerun -np 1 python3 examples/pytorch_digits.py --cuda
step 31-digits-np2 90 horovodlikerun -np 2 python3 examples/pytorch_digits.py --cuda

# 4. Allreduce time per call and bus bandwidth beside torch.distributed.
step 40-allreduce-np1 120 python3 benchmarks/allreduce.py --cuda --np 1 --repeat 3 \
  --sizes 4K,64K,1M,16M,256M --json "$OUT/allreduce-np1.json"
step 41-allreduce-np2 120 python3 benchmarks/allreduce.py --cuda --np 2 --repeat 3 \
  --sizes 4K,64K,1M,16M,64M --json "$OUT/allreduce-np2.json"

# 5. A training step: DistributedOptimizer, no exchange, DDP over NCCL.
step 50-train-step-np1 120 python3 benchmarks/train_step.py --cuda --np 1 --repeat 3 \
  --json "$OUT/train-step-np1.json"

echo "done: $SUMMARY"
