"""DistributedGradientTape against a single-process replica over the global batch (dense and
embedding gradients, every option), then mismatches and bad input: clear errors on every rank,
eagerly and inside tf.function, and the job goes on."""

from tf_common import check, expect

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovodlike.tensorflow as hvd  # noqa: E402

tf.get_logger().setLevel("ERROR")
# No variables to broadcast is a no-op, as in Horovod, and needs no init() (Horovod's
# test_horovod_broadcast_graph_mode relies on it); a collective before init() still raises.
with tf.Graph().as_default():
    no_globals = hvd.broadcast_global_variables(0)
    with tf.compat.v1.Session() as session:
        session.run(no_globals)
check(hvd.broadcast_variables([], 0) is None, "broadcast_variables([]) is not a no-op")
expect(ValueError, lambda: hvd.broadcast_variables([tf.Variable(1.0)], 0), "hvd.init()")
hvd.init()
rank, size = hvd.rank(), hvd.size()
assert size >= 2, "run with at least 2 ranks"

PER_RANK, STEPS, LR = 4, 4, 0.1


def make_variables(seed):
    rng = np.random.default_rng(seed)
    return [tf.Variable(rng.normal(size=(10, 4)), name="embedding"),
            tf.Variable(rng.normal(size=(4, 3)), name="kernel"),
            tf.Variable(rng.normal(size=(3,)), name="bias")]


def global_batch(step):
    rng = np.random.default_rng(100 + step)
    return (rng.integers(0, 10, PER_RANK * size), rng.normal(size=(PER_RANK * size, 3)))


def loss_of(variables, ids, targets):
    embedding, kernel, bias = variables
    hidden = tf.gather(embedding, ids)  # its gradient is a tf.IndexedSlices
    return tf.reduce_mean((tf.tanh(hidden) @ kernel + bias - targets) ** 2)


def train(options, graph, lr_scale=1.0):
    """STEPS of SGD with a DistributedGradientTape; returns the variables."""
    variables = make_variables(seed=3)

    def step(ids, targets):
        with tf.GradientTape() as tape:
            loss = loss_of(variables, ids, targets)
        tape = hvd.DistributedGradientTape(tape, **options)
        grads = tape.gradient(loss, variables)
        for v, g in zip(variables, grads):
            v.assign_sub(LR * lr_scale * tf.convert_to_tensor(g))
        return grads

    step = tf.function(step) if graph else step
    for s in range(STEPS):
        ids, targets = global_batch(s)
        mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        grads = step(tf.constant(ids[mine]), tf.constant(targets[mine]))
    return variables, grads


def replica():
    """One process on the global batch: its mean loss is the mean of the ranks' means."""
    variables = make_variables(seed=3)
    for s in range(STEPS):
        ids, targets = global_batch(s)
        with tf.GradientTape() as tape:
            loss = loss_of(variables, tf.constant(ids), tf.constant(targets))
        for v, g in zip(variables, tape.gradient(loss, variables)):
            v.assign_sub(LR * tf.convert_to_tensor(g))
    return [v.numpy() for v in variables]


expected = replica()
for label, options, graph, tol, lr_scale in [
    ("eager", {}, False, 1e-10, 1.0),
    ("tf.function", {}, True, 1e-10, 1.0),
    ("sparse_as_dense", dict(sparse_as_dense=True), True, 1e-10, 1.0),
    ("predivide", dict(gradient_predivide_factor=2.0), True, 1e-10, 1.0),
    ("fp16", dict(compression=hvd.Compression.fp16), True, 1e-2, 1.0),
    ("op=Sum", dict(op=hvd.Sum), True, 1e-10, 1.0 / size),
    ("groups=2", dict(groups=2), True, 1e-10, 1.0),
    ("groups=[[kernel, bias]]", "groups", False, 1e-10, 1.0),
]:
    if options == "groups":
        options = {}  # filled below, once the variables exist

        def train_with_groups():
            variables = make_variables(seed=3)
            for s in range(STEPS):
                ids, targets = global_batch(s)
                mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
                with tf.GradientTape() as tape:
                    loss = loss_of(variables, tf.constant(ids[mine]), tf.constant(targets[mine]))
                tape = hvd.DistributedGradientTape(tape, groups=[variables[1:]])
                grads = tape.gradient(loss, variables)
                for v, g in zip(variables, grads):
                    v.assign_sub(LR * tf.convert_to_tensor(g))
            return variables, grads
        variables, grads = train_with_groups()
    else:
        variables, grads = train(options, graph, lr_scale)
    for v, want in zip(variables, expected):
        check(np.allclose(v.numpy(), want, rtol=tol, atol=tol),
              f"{label}: {v.name} differs from the single-process run by "
              f"{np.abs(v.numpy() - want).max()}")
    sparse = isinstance(grads[0], tf.IndexedSlices)
    check(sparse == (label != "sparse_as_dense"),
          f"{label}: the embedding gradient is {type(grads[0]).__name__}")
    flat = np.concatenate([v.numpy().ravel() for v in variables])
    everyone = hvd.allgather(flat[None], name=f"weights.{label.replace(' ', '')}").numpy()
    check(all(np.array_equal(everyone[0], everyone[r]) for r in range(size)),
          f"{label}: ranks ended with different weights")

# A source registered as local keeps its own gradient, divided by the number of ranks.
local = tf.Variable([1.0, 2.0])
shared = tf.Variable([1.0, 2.0])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(local * float(rank + 1)) + tf.reduce_sum(shared * float(rank + 1))
tape = hvd.DistributedGradientTape(tape)
tape.register_local_source(local)
g_local, g_shared = tape.gradient(loss, [local, shared])
check(np.allclose(g_local.numpy(), (rank + 1) / size), f"local gradient {g_local.numpy()}")
check(np.allclose(g_shared.numpy(), sum(r + 1 for r in range(size)) / size),
      f"shared gradient {g_shared.numpy()}")
# Nested sources come back in the same structure; unconnected ones stay None.
x, y, z = tf.Variable(1.0), tf.Variable(2.0), tf.Variable(3.0)
with tf.GradientTape() as tape:
    loss = x * float(rank) + y
grads = hvd.DistributedGradientTape(tape).gradient(loss, {"a": x, "b": [y, z]})
check(grads["b"][1] is None and np.isclose(grads["a"].numpy(), (size - 1) / 2)
      and np.isclose(grads["b"][0].numpy(), 1.0), f"nested gradients wrong: {grads}")


# ---- mismatches: TensorMismatchError, which is also tf.errors.FailedPreconditionError (as
# Horovod raises), eagerly, in tf.function and in TensorFlow 1 sessions, on every rank
def works(tag):
    out = hvd.allreduce(tf.fill([3], float(rank)), op=hvd.Sum, name=f"works.{tag}")
    check(out.numpy().tolist() == [float(sum(range(size)))] * 3, f"allreduce after {tag} wrong")


last = size - 1
shape = (4, 2) if rank != last else (2, 4)
expect(hvd.TensorMismatchError, lambda: hvd.allreduce(tf.ones(shape), name="bad.shape"),
       "bad.shape", "shape", "[4, 2]", "[2, 4]", f"rank {last}")
works("shape")
dtype = tf.float32 if rank == 0 else tf.float64
expect(hvd.TensorMismatchError, lambda: hvd.allreduce(tf.ones(3, dtype), name="bad.dtype"),
       "bad.dtype", "float32", "float64")
expect(tf.errors.FailedPreconditionError,
       lambda: hvd.allreduce(tf.ones(3, dtype), name="bad.dtype.tf"), "bad.dtype.tf")
if rank == 0:
    expect(hvd.TensorMismatchError, lambda: hvd.allgather(tf.ones(3), name="bad.op"), "bad.op",
           "allgather", "allreduce")
else:
    expect(hvd.TensorMismatchError, lambda: hvd.allreduce(tf.ones(3), name="bad.op"), "bad.op")
op = hvd.Sum if rank == 0 else hvd.Max
expect(hvd.TensorMismatchError, lambda: hvd.allreduce(tf.ones(3), name="bad.reduce", op=op),
       "bad.reduce", "Sum", "Max")
expect(hvd.TensorMismatchError,
       lambda: hvd.broadcast(tf.ones(3), root_rank=rank % 2, name="bad.root"), "bad.root", "root")
expect(hvd.TensorMismatchError,
       lambda: hvd.allgather(tf.ones([2, 3 + (rank == 1)]), name="bad.gather"), "bad.gather",
       "[2, 3]", "[2, 4]")
works("eager.mismatches")


@tf.function(autograph=False)
def mismatched_in_graph(x):
    return hvd.allreduce(x, name="graph.bad.shape")


expect(tf.errors.FailedPreconditionError, lambda: mismatched_in_graph(tf.ones(shape)),
       "graph.bad.shape", "[4, 2]", "[2, 4]")
check(np.all(mismatched_in_graph(tf.ones([5])).numpy() == 1.0), "graph unusable after mismatch")
works("graph.mismatch")

# A TensorFlow 1 graph run by a session: unnamed collectives, a gradient, then a mismatch.
with tf.Graph().as_default():
    v1_x = tf.ones([2 + rank, 3]) * float(rank + 1)
    v1_gathered = hvd.allgather(v1_x)
    v1_grad = tf.gradients(v1_gathered, v1_x, tf.ones([sum(range(2, size + 2)), 3]))[0]
    # Broadcast's gradient on the ranks other than the root is zero whatever the values, but
    # they must still take part in its allreduce, or the root waits for them forever.
    v1_y = tf.fill([3], float(rank))
    v1_bgrads = [tf.gradients(hvd.broadcast(v1_y, root), v1_y, tf.fill([3], float(rank)))[0]
                 for root in range(size)]
    v1_bad = hvd.allgather(tf.ones([2, 3 + (rank == last)]))
    with tf.compat.v1.Session() as session:
        gathered_np, grad_np = session.run([v1_gathered, v1_grad])
        check(np.array_equal(gathered_np, np.concatenate(
            [np.full([2 + r, 3], float(r + 1)) for r in range(size)])), "TF1 allgather wrong")
        check(np.array_equal(grad_np, np.ones([2 + rank, 3])), "TF1 allgather gradient wrong")
        for root, v1_bgrad in enumerate(v1_bgrads):
            want = (size - 1) / 2 if rank == root else 0.0
            check(np.allclose(session.run(v1_bgrad), want), "TF1 broadcast gradient wrong")
        expect(tf.errors.FailedPreconditionError, lambda: session.run(v1_bad), "[2, 3]",
               "[2, 4]")
works("session.mismatch")

# A TensorFlow 1 graph that grows between runs, each run fetching every collective built so far:
# nothing orders them, and there are more than the cores TensorFlow sizes its thread pool by.
with tf.Graph().as_default():
    grown, rows = [], lambda i, r: i % 3 + 1 + r
    with tf.compat.v1.Session() as session:
        for i in range(12):
            grown.append(hvd.allgather(tf.fill([rows(i, rank)], float(i * size + rank))))
            got = session.run(grown)
    for i, out in enumerate(got):
        want = np.concatenate([np.full([rows(i, r)], float(i * size + r)) for r in range(size)])
        check(np.array_equal(out, want), f"TF1 grown graph: allgather {i} wrong")
works("session.grown")

# broadcast_global_variables: the TensorFlow 1 op over the graph's global variables, which
# eager code and tf.function do not have (a RuntimeError that names the replacement).
with tf.Graph().as_default():
    globals_ = [tf.compat.v1.get_variable(f"global{i}", initializer=tf.fill([i + 2], rank + i))
                for i in range(3)]
    sync = hvd.broadcast_global_variables(size - 1)
    with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(sync)
        for i, value in enumerate(session.run(globals_)):
            check(np.array_equal(value, np.full([i + 2], size - 1 + i)),
                  f"broadcast_global_variables: global{i} is {value}")
expect(RuntimeError, lambda: hvd.broadcast_global_variables(0), "broadcast_variables")
expect(RuntimeError, lambda: tf.function(lambda: hvd.broadcast_global_variables(0))(),
       "broadcast_variables")
check(hvd.util._executing_eagerly() and not tf.function(hvd.util._executing_eagerly)(),
      "hvd.util._executing_eagerly wrong")
check(hvd._executing_eagerly is hvd.util._executing_eagerly, "hvd._executing_eagerly missing")
with tf.Graph().as_default():
    check(not hvd._executing_eagerly(), "hvd._executing_eagerly true in a TF1 graph")
works("broadcast_global_variables")

# Python objects in TensorFlow 1 graph mode (Horovod evaluates them in the default session);
# inside tf.function they cannot be returned as Python objects: ValueError, before sending.
with tf.Graph().as_default(), tf.compat.v1.Session():
    got = hvd.broadcast_object({"from": rank, "rows": [rank] * (rank + 2)}, root_rank=last)
    check(got == {"from": last, "rows": [last] * (last + 2)}, f"TF1 broadcast_object: {got}")
    got = hvd.broadcast_object_fn(root_rank=0)(("root", rank))
    check(got == ("root", 0), f"TF1 broadcast_object_fn: {got}")
    got = hvd.allgather_object({"r": rank, "pad": "x" * rank})
    check(got == [{"r": r, "pad": "x" * r} for r in range(size)], f"TF1 allgather_object: {got}")
expect(ValueError, lambda: tf.function(lambda: hvd.allgather_object(rank))(), "allgather_object",
       "inside tf.function")
works("objects")

# DistributedOptimizer around a TensorFlow 1 optimizer: compute_gradients reduces over the ranks
# (a registered local variable keeps its own gradient, divided by the size), in a session.
with tf.Graph().as_default():
    coeff = np.arange(1.0, 4.0)
    shared_w = tf.compat.v1.get_variable("shared_w", initializer=np.zeros(3), use_resource=False)
    local_w = tf.compat.v1.get_variable("local_w", initializer=np.zeros(3))
    loss = tf.reduce_sum((shared_w + local_w) * (coeff * (rank + 1)))
    for op, want_shared in ((hvd.Average, coeff * (size + 1) / 2),
                            (hvd.Sum, coeff * size * (size + 1) / 2)):
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5), op=op)
        opt.register_local_var(local_w)
        grads = opt.compute_gradients(loss, var_list=[shared_w, local_w])
        step = opt.apply_gradients(grads)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(step)
            got_shared, got_local = session.run([shared_w, local_w])
        check(np.allclose(got_shared, -0.5 * want_shared), f"TF1 optimizer {op}: {got_shared}")
        check(np.allclose(got_local, -0.5 * coeff * (rank + 1) / size),
              f"TF1 optimizer local variable: {got_local}")
expect(ValueError, lambda: hvd.DistributedOptimizer(
    tf.compat.v1.train.GradientDescentOptimizer(0.1), backward_passes_per_step=2),
    "backward_passes_per_step", "GradientDescentOptimizer")
works("tf1_optimizer")

# ---- bad input raises before anything is sent, eagerly and when a tf.function is traced
for mode, wrap in (("eager", lambda f: f), ("graph", lambda f: tf.function(f, autograph=False))):
    expect(TypeError, wrap(lambda: hvd.allreduce(tf.ones(2, tf.complex64), name="cx")), "cx",
           "complex64", "not supported")
    expect(TypeError, wrap(lambda: hvd.allgather(tf.ones(2, tf.uint32), name="u32")), "uint32")
    expect(TypeError, wrap(lambda: hvd.broadcast(tf.constant(["a"]), 0, name="str")), "string")
    expect(ValueError, wrap(lambda: hvd.broadcast(tf.ones(2), root_rank=size, name="far")),
           "far", f"root_rank {size}")
    expect(ValueError, wrap(lambda: hvd.broadcast(tf.ones(2), root_rank=-1, name="neg")), "neg")
    expect(TypeError, wrap(lambda: hvd.broadcast(tf.ones(2), root_rank=0.5, name="half")), "int")
    expect(ValueError, wrap(lambda: hvd.allreduce(tf.ones(2, tf.bool), name="bavg")), "bavg",
           "bool")
    expect(ValueError, wrap(lambda: hvd.allreduce(tf.ones(2), op=17, name="op17")), "17")
    expect(ValueError, wrap(lambda: hvd.allreduce(tf.ones(2, tf.int32), op=hvd.Adasum,
                                                  name="adasum_int")), "adasum_int", "int32")
    expect(ValueError, wrap(lambda: hvd.allgather(tf.constant(1.0), name="scalar")), "scalar")
    expect(ValueError, wrap(lambda: hvd.reducescatter(tf.constant(1.0), name="rs0")), "scalar")
    expect(ValueError, wrap(lambda: hvd.alltoall(tf.ones(2 * size + 1), name="uneven")),
           "uneven", "divide evenly")
    expect(NotImplementedError, wrap(lambda: hvd.allreduce(
        tf.IndexedSlices(tf.ones([1, 2]), [0], [3, 2]), op=hvd.Max)), "IndexedSlices",
        "sparse_as_dense")
    expect(NotImplementedError, wrap(lambda: hvd.allreduce(
        tf.IndexedSlices(tf.ones([1, 2]), [0], [3, 2]), op=hvd.Sum, prescale_factor=2.0)),
        "IndexedSlices", "prescale_factor")
    # Horovod's classes too: its collectives are TensorFlow ops raising tf.errors.
    expect(tf.errors.InvalidArgumentError,
           wrap(lambda: hvd.alltoall(tf.ones(2 * size + 1), name="uneven_tf")), "divide evenly")
    expect(tf.errors.InvalidArgumentError,
           wrap(lambda: hvd.allreduce(tf.ones(2), op=17, name="op17_tf")), "17")
    expect(ValueError, wrap(lambda: hvd.allreduce(tf.ones(2), op=hvd.Sum, average=True)),
           "mutually exclusive")
expect(ValueError, lambda: hvd.alltoall(tf.ones(3), splits=[1] * (size + 1), name="splits"),
       "splits", "non-negative counts")
expect(ValueError, lambda: tf.function(lambda: hvd.broadcast_object(1))(), "inside tf.function")
expect(ValueError, lambda: tf.function(lambda: hvd.allreduce(tf.ones(2)), jit_compile=True)(),
       "XLA", "jit_compile=False")
expect(ValueError, lambda: hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Adasum,
                                                       gradient_predivide_factor=2.0), "Average")
expect(ValueError, lambda: hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Sum,
                                                       gradient_predivide_factor=2.0), "Average")
expect(TypeError, lambda: hvd.DistributedOptimizer(object()), "Keras optimizer", "object")
works("end")
print(f"rank {rank}: tensorflow training and errors OK", flush=True)
