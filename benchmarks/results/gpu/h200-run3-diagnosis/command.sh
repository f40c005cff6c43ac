#!/bin/bash
# one-off diagnosis of the segfault
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
O=${OUT:-/tmp/diag}; mkdir -p $O
cat > /tmp/np1.py <<'PY'
import torch, horovodlike.torch as hvd
hvd.init()
print("init ok", flush=True)
t = torch.arange(33, dtype=torch.float32)
print("allreduce", hvd.allreduce(t, op=hvd.Sum, name="a")[:4], flush=True)
print("broadcast", hvd.broadcast(t, 0, name="b")[:4], flush=True)
PY
{
which cuda-gdb; ls -la /dev/shm; df -h /dev/shm; uname -a; cat /proc/cpuinfo | grep -m1 "model name"; grep -m1 flags /proc/cpuinfo
time cmake -S . -B /tmp/bd -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE=$(command -v python3) \
  -Dpybind11_DIR=$(python3 -c 'import pybind11; print(pybind11.get_cmake_dir())') > /tmp/cmake.log 2>&1 || tail -20 /tmp/cmake.log
time ninja -C /tmp/bd > /tmp/ninja.log 2>&1 || tail -30 /tmp/ninja.log
grep -E "CMAKE_CXX_FLAGS_RELWITHDEBINFO|CMAKE_CXX_COMPILER:" /tmp/bd/CMakeCache.txt
cp /tmp/bd/_core*.so src/horovodlike/
} > $O/diag-build.txt 2>&1
export PYTHONPATH=$PWD/src
run() { echo "=== $*"; timeout 60 "$@" 2>&1 | tail -40; echo "rc=${PIPESTATUS[0]}"; }
{
run python3 /tmp/np1.py
run python3 -m horovodlike.runner.launch -np 1 python3 /tmp/np1.py
HOROVOD_SHM_DISABLE=1 run python3 -m horovodlike.runner.launch -np 1 python3 /tmp/np1.py
CUDA_VISIBLE_DEVICES= run python3 -m horovodlike.runner.launch -np 1 python3 /tmp/np1.py
run python3 -m horovodlike.runner.launch -np 2 python3 /tmp/np1.py
(cd tests/workers && run python3 torch_device_worker.py cpu)
} > $O/diag-runs.txt 2>&1
timeout 120 cuda-gdb -batch -ex "set pagination off" -ex "handle SIGUSR1 SIGUSR2 SIG32 SIG33 SIG34 SIG35 SIGPIPE nostop noprint pass" -ex run -ex bt -ex "info threads" -ex "thread apply all bt 25" --args python3 /tmp/np1.py > $O/diag-gdb.txt 2>&1
(cd tests/workers && timeout 120 cuda-gdb -batch -ex "set pagination off" -ex "handle SIGUSR1 SIGUSR2 SIG32 SIG33 SIG34 SIG35 SIGPIPE nostop noprint pass" -ex run -ex bt -ex "info threads" -ex "thread apply all bt 25" --args python3 torch_device_worker.py cpu > $O/diag-gdb-worker.txt 2>&1)
cp .gpu_check/prebuilt/_core*.so src/horovodlike/
{ run python3 /tmp/np1.py; } > $O/diag-prebuilt.txt 2>&1
ls -la $O
