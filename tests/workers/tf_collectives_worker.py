"""Every TensorFlow collective, op and dtype against NumPy on every rank, eagerly and inside
tf.function; every collective's gradient against Horovod's rule for it; process sets, objects, variables, barrier and join.
Run with HOROVOD_DYNAMIC_PROCESS_SETS=1."""

from tf_common import DTYPES, OPS, check, expect, expected_reduce, rank_input

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovodlike.tensorflow as hvd  # noqa: E402

tf.get_logger().setLevel("ERROR")  # this worker traces many small functions on purpose
hvd.init()
rank, size = hvd.rank(), hvd.size()
SEED = 7
OP = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max,
      "Product": hvd.Product}
checked = 0


def to_tf(values, dtype):
    return tf.cast(tf.constant(values, dtype=tf.float64), dtype)


def as_f64(tensor):
    return tf.cast(tensor, tf.float64).numpy()


def close(got, want, dtype, op="Sum"):
    # Inputs, sums and products are exact in every dtype; averages are rounded.
    tol = {"float16": 1e-2, "bfloat16": 1e-2, "float32": 1e-6}.get(dtype, 1e-9) \
        if op == "Average" else 0
    return got.shape == want.shape and np.allclose(got, want, rtol=tol, atol=tol)


def both(function, *args):
    """function(*args) eagerly and inside a tf.function, as ("eager", result), ("graph", ...)."""
    return [("eager", function(*args)), ("graph", tf.function(function, autograph=False)(*args))]


# ---- allreduce: every dtype, op and size; named eagerly, unnamed (traced names) in a graph
SIZES = [0, 1, 7, 1000]
for dtype in DTYPES:
    cases = [(op, n) for op in OPS for n in SIZES if not (dtype == "bool" and op == "Average")]
    inputs = {c: [rank_input(dtype, c[1], r, SEED, c[0]) for r in range(size)] for c in cases}
    mine = [to_tf(inputs[c][rank], dtype) for c in cases]

    def reduce_all(tensors, named):
        return [hvd.allreduce(t, op=OP[op], name=f"ar.{dtype}.{op}.{n}" if named else None)
                for t, (op, n) in zip(tensors, cases)]

    for mode, outs in [("eager", reduce_all(mine, True)),
                       ("graph", tf.function(reduce_all, autograph=False)(mine, False))]:
        for out, (op, n), t in zip(outs, cases, mine):
            want = expected_reduce(inputs[(op, n)], op, dtype, size)
            check(out.dtype == t.dtype, f"{mode} allreduce {dtype} {op}: dtype {out.dtype}")
            check(close(as_f64(out), want, dtype, op),
                  f"{mode} allreduce {dtype} {op} {n}: rank {rank} got {as_f64(out)[:5]}, "
                  f"want {want[:5]}")
            checked += 1
    # The same as one group.
    grouped = hvd.grouped_allreduce(mine, op=hvd.Max, name=f"grouped.{dtype}")
    for out, c in zip(grouped, cases):
        check(close(as_f64(out), expected_reduce(inputs[c], "Max", dtype, size), dtype),
              f"grouped allreduce {dtype} wrong")
# A graph traced once runs again with new values and the same names.
twice = tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum))
for step in range(3):
    out = twice(tf.fill([5], float(rank + step)))
    check(np.all(out.numpy() == sum(r + step for r in range(size))), f"graph rerun {step} wrong")

# Prescale and postscale, before and after the sum.
for dtype in ("float32", "float64", "float16", "int32"):
    inputs = [rank_input(dtype, 101, r, SEED) for r in range(size)]
    post = 0.5 if dtype != "int32" else 3.0
    for mode, out in both(lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0,
                                                  postscale_factor=post),
                          to_tf(inputs[rank], dtype)):
        check(np.allclose(as_f64(out), sum(inputs) * 2.0 * post, rtol=1e-3),
              f"{mode} scaled {dtype} wrong")
# The deprecated average argument.
out = hvd.allreduce(tf.constant([float(rank)]), average=False, name="average.false")
check(out.numpy()[0] == sum(range(size)), "average=False is not Sum")

# ---- allgather: first dimensions differ per rank (r + 1 rows, or none on odd ranks); one
# traced function gathers every dtype
for rows_of in (lambda r: r + 1, lambda r: 0 if r % 2 else 2):
    parts = {d: [rank_input(d, rows_of(r) * 3, r, SEED).reshape(rows_of(r), 3)
                 for r in range(size)] for d in DTYPES}
    mine = [to_tf(parts[d][rank], d) for d in DTYPES]
    for mode, outs in both(lambda ts: [hvd.allgather(t) for t in ts], mine):
        for dtype, out, t in zip(DTYPES, outs, mine):
            want = np.concatenate(parts[dtype])
            check(out.dtype == t.dtype and tuple(out.shape) == want.shape,
                  f"{mode} allgather {dtype}: shape {tuple(out.shape)} != {want.shape}")
            check(np.array_equal(as_f64(out), want), f"{mode} allgather {dtype}: wrong values")
            checked += 1
gathered = hvd.grouped_allgather([tf.constant([rank]), tf.fill([rank + 1, 2], float(rank))])
check(gathered[0].numpy().tolist() == list(range(size)), "grouped allgather 1-D wrong")
check(gathered[1].shape[0] == sum(r + 1 for r in range(size)), "grouped allgather 2-D wrong")

# ---- broadcast from every root, every dtype
for root in range(size):
    values = {(d, n): [rank_input(d, n, r, SEED) for r in range(size)]
              for d in DTYPES for n in (1, 33)}
    keys = list(values)
    mine = [to_tf(values[k][rank], k[0]) for k in keys]
    for mode, outs in both(lambda ts: [hvd.broadcast(t, root) for t in ts], mine):
        for (dtype, n), out in zip(keys, outs):
            check(np.array_equal(as_f64(out), values[(dtype, n)][root]),
                  f"{mode} broadcast root {root} {dtype} {n}: wrong values")
            checked += 1
scalar = hvd.broadcast(tf.constant(rank, tf.int64), size - 1)
check(scalar.shape == () and scalar.numpy() == size - 1, "broadcast of a scalar wrong")


# ---- alltoall: rank k sends send_rows(k, j) rows to rank j (some none)
def send_rows(k, j):
    return (k + 2 * j) % 3


def alltoall_expected(parts, me):
    pieces = []
    for k in range(size):
        offset = sum(send_rows(k, j) for j in range(me))
        pieces.append(parts[k][offset:offset + send_rows(k, me)])
    return np.concatenate(pieces), [send_rows(k, me) for k in range(size)]


for dtype in ("float32", "int64", "bool", "bfloat16", "uint8"):
    parts = [rank_input(dtype, 2 * sum(send_rows(k, j) for j in range(size)), k, SEED)
             .reshape(-1, 2) for k in range(size)]
    want, want_splits = alltoall_expected(parts, rank)
    splits = [send_rows(rank, j) for j in range(size)]
    for mode, (out, received) in both(lambda x, s: hvd.alltoall(x, splits=s),
                                      to_tf(parts[rank], dtype), tf.constant(splits)):
        check(np.array_equal(as_f64(out), want), f"{mode} alltoall {dtype}: wrong values")
        check(received.dtype == tf.int32 and received.numpy().tolist() == want_splits,
              f"{mode} alltoall {dtype}: received splits {received.numpy()}")
        checked += 1
equal = [np.arange(2 * size, dtype=np.float32) + 100 * r for r in range(size)]
for mode, out in both(hvd.alltoall, tf.constant(equal[rank])):
    check(out.numpy().tolist() == [equal[k][2 * rank + i] for k in range(size) for i in range(2)],
          f"{mode} alltoall with equal splits wrong")

# ---- reducescatter: 2 * size + 1 rows, so the first ranks get one row more
ROWS = 2 * size + 1
counts = [ROWS // size + (1 if p < ROWS % size else 0) for p in range(size)]
start = sum(counts[:rank])
cases = [(d, op) for d in DTYPES for op in (("Sum", "Max") if d != "float32" else OPS)]
inputs = {c: [rank_input(c[0], ROWS * 2, r, SEED, c[1]).reshape(ROWS, 2) for r in range(size)]
          for c in cases}
mine = [to_tf(inputs[c][rank], c[0]) for c in cases]
for mode, outs in both(lambda ts: [hvd.reducescatter(t, op=OP[c[1]]) for t, c in zip(ts, cases)],
                       mine):
    for (dtype, op), out in zip(cases, outs):
        want = expected_reduce(inputs[(dtype, op)], op, dtype, size)[start:start + counts[rank]]
        check(close(as_f64(out), want, dtype, op),
              f"{mode} reducescatter {dtype} {op}: got {as_f64(out)}, want {want}")
        checked += 1
outs = hvd.grouped_reducescatter([tf.ones([ROWS, 2]), tf.ones([size])], op=hvd.Sum)
check(np.all(outs[0].numpy() == size) and outs[0].shape[0] == counts[rank]
      and outs[1].numpy().tolist() == [float(size)], "grouped reducescatter wrong")

# ---- tf.IndexedSlices: allreduce gathers every rank's rows
slices_values = [rank_input("float32", (r + 1) * 3, r, SEED).reshape(r + 1, 3) for r in range(size)]
slices_indices = [np.arange(r + 1) * 2 % 5 for r in range(size)]
dense = np.zeros((5, 3))
for values, indices in zip(slices_values, slices_indices):
    np.add.at(dense, indices, values)
mine = tf.IndexedSlices(tf.constant(slices_values[rank], tf.float32),
                        tf.constant(slices_indices[rank], tf.int64), tf.constant([5, 3], tf.int64))
for op, want in (("Sum", dense), ("Average", dense / size)):
    for mode, out in both(lambda s: hvd.allreduce(s, op=OP[op]), mine):
        check(isinstance(out, tf.IndexedSlices), f"{mode} IndexedSlices allreduce lost its type")
        check(np.allclose(tf.convert_to_tensor(out).numpy(), want),
              f"{mode} IndexedSlices allreduce {op} wrong")
# Average of integer values divides as TensorFlow's "/" does (uint8 -> float32), as in Horovod.
mine_u8 = tf.IndexedSlices(tf.fill([1, 2], tf.constant(rank + 1, tf.uint8)), tf.constant([0]))
for mode, out in both(lambda s: hvd.allreduce(s, op=hvd.Average), mine_u8):
    check(out.values.dtype == tf.float32 and np.allclose(
        out.values.numpy(), np.repeat(np.arange(1, size + 1, dtype=np.float32), 2)
        .reshape(size, 2) / size), f"{mode} IndexedSlices uint8 Average wrong: {out.values}")


# ---- gradients, against Horovod's rules. Rank r's loss is sum(weight(r) * output), so each
# rule is written with every rank's weights: allgather and broadcast average the incoming
# gradients, reducescatter allgathers them (times the set's size for Sum).
def weight_np(r, shape):
    n = int(np.prod(shape))
    return (np.arange(n) % 7 + r + 1).reshape(shape).astype(np.float64)


def weight_tf(out):
    w = tf.reshape(tf.range(tf.size(out)) % 7, tf.shape(out))
    return tf.cast(w, tf.float64) + float(rank + 1)


def gradients(function, x):
    """The gradient of this rank's loss through function, eagerly and in a tf.function."""
    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = function(x)
            loss = tf.add_n([tf.reduce_sum(weight_tf(o) * o) for o in tf.nest.flatten(out)])
        return tape.gradient(loss, x)
    return both(grad, tf.constant(x, tf.float64))


def check_gradient(label, function, x, want):
    for mode, got in gradients(function, x):
        got = got.numpy() if not isinstance(got, list) else [g.numpy() for g in got]
        ok = all(np.allclose(g, w) for g, w in zip(got, want)) if isinstance(want, list) else \
            np.allclose(got, want)
        check(ok, f"{mode} gradient of {label} wrong on rank {rank}: {got} != {want}")


x = rank_input("float64", 8, rank, SEED).reshape(4, 2)
sum_w = sum(weight_np(r, (4, 2)) for r in range(size))
check_gradient("allreduce Sum", lambda t: hvd.allreduce(t, op=hvd.Sum), x, sum_w)
check_gradient("allreduce Average", lambda t: hvd.allreduce(t), x, sum_w / size)
check_gradient("allreduce scaled", lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0,
                                                         postscale_factor=3.0), x, 6.0 * sum_w)
check_gradient("allreduce Max (the gradients' Max)", lambda t: hvd.allreduce(t, op=hvd.Max), x,
               weight_np(size - 1, (4, 2)))
check_gradient("grouped allreduce", lambda t: hvd.grouped_allreduce([t, 2.0 * t], op=hvd.Sum), x,
               3.0 * sum_w)

rows = [r + 1 for r in range(size)]
total, first = sum(rows), sum(rows[:rank])
xg = rank_input("float64", rows[rank] * 2, rank, SEED).reshape(rows[rank], 2)
mean_wg = sum(weight_np(r, (total, 2)) for r in range(size)) / size
check_gradient("allgather", hvd.allgather, xg, mean_wg[first:first + rows[rank]])
check_gradient("grouped allgather", lambda t: hvd.grouped_allgather([t, t]), xg,
               2 * mean_wg[first:first + rows[rank]])

check_gradient("broadcast", lambda t: hvd.broadcast(t, size - 1), x,
               sum_w / size if rank == size - 1 else np.zeros((4, 2)))

splits = [send_rows(rank, j) for j in range(size)]
xa = rank_input("float64", sum(splits) * 2, rank, SEED).reshape(-1, 2)
want = np.zeros_like(xa)
for r in range(size):  # my rows sent to rank r sit in r's output after lower ranks' rows
    received_rows = sum(send_rows(k, r) for k in range(size))
    at = sum(send_rows(k, r) for k in range(rank))
    offset = sum(splits[:r])
    want[offset:offset + splits[r]] = weight_np(r, (received_rows, 2))[at:at + splits[r]]
check_gradient("alltoall", lambda t: hvd.alltoall(t, splits=splits)[0], xa, want)

xr = rank_input("float64", ROWS * 2, rank, SEED).reshape(ROWS, 2)
scattered = np.concatenate([weight_np(r, (counts[r], 2)) for r in range(size)])
check_gradient("reducescatter Sum", lambda t: hvd.reducescatter(t, op=hvd.Sum), xr,
               scattered * size)
check_gradient("reducescatter Average", lambda t: hvd.reducescatter(t), xr, scattered)

# ---- variables, objects, barrier
v = tf.Variable(tf.fill([3], float(rank)))
w = tf.Variable(tf.constant(rank, tf.int64))
hvd.broadcast_variables([v, w], root_rank=size - 1)
check(np.all(v.numpy() == size - 1) and w.numpy() == size - 1, "broadcast_variables wrong")
v.assign(tf.fill([3], float(rank)))


@tf.function
def broadcast_in_graph():
    hvd.broadcast_variables([v], root_rank=0)


broadcast_in_graph()
check(np.all(v.numpy() == 0), "broadcast_variables in tf.function wrong")
obj = hvd.broadcast_object({"rank": rank, "list": list(range(rank + 3))}, root_rank=size - 1)
check(obj == {"rank": size - 1, "list": list(range(size + 2))}, f"broadcast_object: {obj}")
objs = hvd.allgather_object(("r", rank, "x" * rank))
check(objs == [("r", r, "x" * r) for r in range(size)], f"allgather_object: {objs}")
hvd.barrier()
tf.function(lambda: hvd.barrier())()
check(hvd.size_op().numpy() == size and hvd.rank_op().numpy() == rank, "size_op/rank_op wrong")

# ---- process sets: all but rank 1 (rank 0 alone with 2 ranks)
members = [r for r in range(size) if r != 1] if size > 2 else [0]
subset = hvd.add_process_set(members) if size > 1 else hvd.global_process_set
if size == 1:
    pass
elif rank in members:
    n, me = len(members), members.index(rank)
    for mode, out in both(lambda t: hvd.allreduce(t, op=hvd.Sum, process_set=subset),
                          tf.constant([float(rank)])):
        check(out.numpy()[0] == sum(members), f"{mode} allreduce in a process set wrong")
    for mode, out in both(lambda t: hvd.allgather(t, process_set=subset), tf.constant([rank])):
        check(out.numpy().tolist() == members, f"{mode} allgather in a process set wrong")
    out = hvd.broadcast(tf.constant([rank]), members[-1], process_set=subset)
    check(out.numpy().tolist() == [members[-1]], "broadcast in a process set wrong")
    out = hvd.alltoall(tf.constant([rank] * n), process_set=subset)
    check(out.numpy().tolist() == members, "alltoall in a process set wrong")
    out = hvd.reducescatter(tf.ones([n, 2]), op=hvd.Sum, process_set=subset)
    check(out.shape == (1, 2) and np.all(out.numpy() == n), "reducescatter in a process set")
    check_gradient("allgather in a process set", lambda t: hvd.allgather(t, process_set=subset),
                   np.ones((1, 2)), sum(weight_np(r, (n, 2)) for r in members)[me:me + 1] / n)
    check(hvd.size_op(subset.process_set_id).numpy() == n, "size_op of a process set wrong")
    hvd.barrier(process_set=subset)
else:
    expect(ValueError, lambda: hvd.allreduce(tf.ones(1), process_set=subset),
           f"rank {rank} is not in the process set")
    check(hvd.process_set_included_op(subset.process_set_id).numpy() == 0, "included_op wrong")
if size > 1:
    check(hvd.remove_process_set(subset), "remove_process_set returned False")
    expect(ValueError, lambda: hvd.allreduce(tf.ones(1), process_set=subset), "not registered")

# ---- join: rank r runs r + 2 steps; the joined ranks contribute zeros to the others' sums
results = [hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name=f"join.step{step}").numpy()[0]
           for step in range(rank + 2)]
last = hvd.join()
check(int(last) == size - 1, f"join returned {int(last)}, expected {size - 1}")
for step, got in enumerate(results):
    check(got == sum(1 for r in range(size) if r + 2 > step), f"join step {step}: sum {got}")

print(f"rank {rank}: {checked} checks passed; tensorflow collectives OK", flush=True)
