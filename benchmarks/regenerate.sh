#!/bin/sh
# Regenerates the raw outputs behind docs/performance.md and docs/performance-multihost.md in
# benchmarks/results/ (and the plots), with the reduced sizes and repeats used there. Run from the
# repository root, as root (the emulated hosts need network namespaces and tc), after building
# the core in place. Each output starts with its command and records the load average.
set -e
cd "$(dirname "$0")/.."
R=benchmarks/results
PY=${PYTHON:-python3}
run() {  # run OUTPUT.txt COMMAND...: the command line, then its output, into OUTPUT.txt
  out=$1; shift
  { echo "$ $*"; echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"; "$@"; \
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"; } > "$out" 2>&1
}
run $R/multihost.txt $PY benchmarks/multihost.py --hosts 2,4 --rates 1gbit,10gbit \
    --sizes 4K,64K,1M,8M --repeat 2 --iter-scale 0.05 --timeout 300 --json $R/multihost.json
run $R/alphabeta.txt $PY benchmarks/alphabeta.py $R/multihost.json --plots $R \
    --json $R/alphabeta.json
run $R/allreduce-np2.txt $PY benchmarks/allreduce.py --np 2 --json $R/allreduce-np2.json
run $R/latency_breakdown.txt $PY benchmarks/latency_breakdown.py --size 4K --calls 2000 \
    --json $R/latency_breakdown.json
run $R/autotune.txt $PY benchmarks/autotune.py --np 2 --thresholds 1,16,64 --cycles 1,5 \
    --steps 5 --windows 3 --steps-per-sample 3 --max-samples 8 --repeat 2 --json $R/autotune.json
run $R/allreduce-np2-mpi-bindings.txt $PY benchmarks/allreduce.py --np 2 --sizes 4K,64K,1M,64M \
    --repeat 2 --only hvdl-shm,MPI,torch-gloo --json $R/allreduce-np2-mpi-bindings.json
# 20 jobs of each library, in turns (the order reversed every other round): every job's figure,
# the worst job against the median one, and the memory bound measured in the same run.
for np in 2 4; do
  run $R/allreduce-np$np-jobs.txt $PY benchmarks/allreduce.py --np $np --sizes 4K,64K,1M,64M \
      --repeat 20 --iter-scale 0.3 --alternate --only hvdl-shm,MPI,mem-bound \
      --json $R/allreduce-np$np-jobs.json
done
# Early staging, off and on in the same tree, in turns; and small messages at 4 ranks against MPI.
for np in 2 4; do
  run $R/compare-early-staging-np$np.txt $PY benchmarks/compare_builds.py --before src \
      --after src --before-env HOROVOD_EARLY_STAGING=0 --rounds 10 --np $np --sizes 4K,8K \
      --only hvdl-shm --json $R/compare-early-staging-np$np.json
done
run $R/allreduce-np4-small-jobs.txt $PY benchmarks/allreduce.py --np 4 --sizes 4K,64K \
    --repeat 10 --iter-scale 0.3 --alternate --only hvdl-shm,MPI \
    --json $R/allreduce-np4-small-jobs.json
# The ways of writing the shared-memory slots: the default (auto) beside ordinary stores only
# and streaming stores only, in turns, each job with the cross-core probe around it.
for np in 2 4; do
  rounds=$((np == 2 ? 12 : 10))
  run $R/allreduce-np$np-slot-stores.txt $PY benchmarks/allreduce.py --np $np --sizes 4K,1M,64M \
      --repeat $rounds --iter-scale 0.3 --alternate \
      --only hvdl-shm,hvdl-shm-ordinary,hvdl-shm-streaming,MPI,mem-bound \
      --json $R/allreduce-np$np-slot-stores.json
done
# MPI at its best: each of Open MPI's tuned allreduce algorithms, bound and unbound, and without
# its single-copy mechanism; beside horovodlike over shared memory and over MPI's point-to-point.
run $R/allreduce-np2-mpi-tuned.txt $PY benchmarks/allreduce.py --np 2 --sizes 4K,64K,1M,64M \
    --repeat 3 --mpi-configs tuned --only hvdl-shm,hvdl-mpi,MPI --json $R/allreduce-np2-mpi-tuned.json
mkdir -p $R/train_step-trace
run $R/train_step-np2.txt $PY benchmarks/train_step.py --np 2 --only horovodlike,nosync --windows 3 \
    --repeat 3 --trace-dir $R/train_step-trace --json $R/train_step-np2.json
run $R/train_step_timeline.txt $PY benchmarks/timeline_plot.py $R/train_step-trace \
    --png $R/train_step_timeline.png
run $R/train_step-np2-bound.txt $PY benchmarks/train_step.py --np 2 \
    --only horovodlike,nosync,exchange --windows 3 --repeat 3 --json $R/train_step-np2-bound.json
run $R/train_step-np2-overlap-off.txt $PY benchmarks/train_step.py --np 2 --only horovodlike,nosync \
    --variant HOROVOD_OVERLAP=0 --windows 3 --repeat 5 --json $R/train_step-np2-overlap-off.json
# The same bound within one job: the windows of each kind take turns in the same processes.
run $R/train_bound-np2.txt $PY benchmarks/train_bound.py --np 2 --rounds 20 \
    --json $R/train_bound-np2.json
# What an idle job costs (this build alone; the committed outputs ran it beside the build
# before the idle loop's slowing, see benchmarks/README.md).
for np in 2 4; do
  run $R/idle_cpu-np$np.txt $PY benchmarks/idle_cpu.py --np $np --seconds 3 --repeat 3 \
      --json $R/idle_cpu-np$np.json
done
mkdir -p $R/multi_copy-trace
run $R/multi_copy.txt $PY benchmarks/multi_copy.py --json $R/multi_copy.json \
    --png $R/multi_copy_timeline.png --trace-dir $R/multi_copy-trace
# Writes its own .txt (command, commit, load) and .json.
$PY benchmarks/planner_search.py --out $R/planner_search
# The documentation's Performance page shows the plots from its own folder (mkdocs serves only docs/).
cp $R/multihost-busbw-1gbit.png $R/multihost-busbw-10gbit.png $R/model-busbw-1gbit.png \
    $R/model-busbw-10gbit.png $R/train_step_timeline.png $R/multi_copy_timeline.png docs/img/
