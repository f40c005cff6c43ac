"""A pipeline step as the runtime runs it: Schedule1F1B's action lists played out event by
event, each stage's forward and backward of a micro-batch waiting for its input from the
neighbouring stage, and the ranks of a host sharing its cores.

Sharing is processor sharing: while k ranks of a machine compute on c cores, each advances at
min(1, c / k) of its speed alone, and slower again while its neighbours on the other cores
take their share of the caches and memory bandwidth (``slowdown``), so a pipeline's bubbles
(stages waiting for a neighbour) give their cores to the stages that compute. A hand-off on a
machine whose ranks outnumber its cores arrives ``wake_s`` later: sender and receiver get a
core only in the scheduler's turn (calibrate() measures it: cost_model.Contention).
"""

import dataclasses

FORWARD, BACKWARD = "F", "B"


def one_f_one_b(stage, stages, micro_batches):
    """Schedule1F1B's actions for ``stage``: (pp - 1 - stage) forwards, then one forward and
    one backward in turn, then the remaining backwards."""
    warmup = min(stages - 1 - stage, micro_batches)
    actions = [(FORWARD, m) for m in range(warmup)]
    for i in range(micro_batches - warmup):
        actions += [(FORWARD, warmup + i), (BACKWARD, i)]
    return actions + [(BACKWARD, m) for m in range(micro_batches - warmup, micro_batches)]


@dataclasses.dataclass
class StageWork:
    """One stage's seconds per micro-batch: ``forward``/``backward`` of compute alone on a
    core, ``forward_wait``/``backward_wait`` blocked in the stage's own collectives (tensor
    parallel allreduces), not computing; ``host``: which host its ranks are on; ``ranks``: how
    many ranks of that host run it (its data and tensor parallel replicas)."""
    forward: float
    backward: float
    forward_wait: float = 0.0
    backward_wait: float = 0.0
    host: int = 0
    ranks: int = 1


def simulate_1f1b(stages, micro_batches, send_s, cores=None, wake_s=0.0,
                  slowdown=lambda busy: 1.0):
    """Plays a step of Schedule1F1B over ``stages`` (StageWork, first to last); ``send_s[i]``:
    the seconds from stage i finishing a micro-batch's forward to stage i + 1 having it (and
    the gradient's way back), to which every hand-off adds ``wake_s`` (on a host with more
    ranks than cores: Contention.wake_s); ``cores``: cores per host (None: a core per rank);
    ``slowdown(k)``: how much slower than alone each of k ranks computing on k of a host's
    cores at once runs (they share caches and memory). Returns each stage's time of its last
    backward's end (the step starts at 0)."""
    pp = len(stages)
    actions = [one_f_one_b(s, pp, micro_batches) for s in range(pp)]
    position = [0] * pp
    # A running action: [seconds of compute left, seconds of waiting after it]
    running = [None] * pp
    arrived = {}             # (kind, stage, micro-batch) -> when its input is there
    done = [0.0] * pp
    now = 0.0

    def needs(s):
        kind, m = actions[s][position[s]]
        if kind == FORWARD and s > 0:
            return (FORWARD, s, m)
        if kind == BACKWARD and s < pp - 1:
            return (BACKWARD, s, m)
        return None

    def computing(host):
        return sum(stages[s].ranks for s in range(pp)
                   if running[s] is not None and running[s][0] > 0 and stages[s].host == host)

    while any(position[s] < len(actions[s]) for s in range(pp)):
        for s in range(pp):
            if running[s] is None and position[s] < len(actions[s]):
                need = needs(s)
                if need is None or arrived.get(need, float("inf")) <= now:
                    kind = actions[s][position[s]][0]
                    work = stages[s]
                    running[s] = ([work.forward, work.forward_wait] if kind == FORWARD
                                  else [work.backward, work.backward_wait])
        rates = {}
        for s in range(pp):
            if running[s] is not None and running[s][0] > 0:
                host = stages[s].host
                if host not in rates:
                    k = max(1, computing(host))
                    if cores is None:
                        rates[host] = 1.0 / slowdown(k)
                    else:
                        rates[host] = min(1.0, cores / k) / slowdown(min(k, cores))
        step = float("inf")
        for s in range(pp):
            if running[s] is not None:
                left, wait = running[s]
                step = min(step, left / rates[stages[s].host] if left > 0 else wait)
            elif position[s] < len(actions[s]):
                when = arrived.get(needs(s))
                if when is not None:
                    step = min(step, when - now)
        if step == float("inf"):
            raise RuntimeError("simulate_1f1b: the schedule waits for an input that never "
                               "comes")
        step = max(step, 0.0)
        now += step
        for s in range(pp):
            if running[s] is None:
                continue
            if running[s][0] > 0:
                running[s][0] = max(0.0, running[s][0] - step * rates[stages[s].host])
                if running[s][0] < 1e-15:
                    running[s][0] = 0.0
                continue
            running[s][1] -= step
            if running[s][1] > 1e-15:
                continue
            kind, m = actions[s][position[s]]
            running[s] = None
            position[s] += 1
            if position[s] == len(actions[s]):
                done[s] = now
            peer = s + 1 if kind == FORWARD else s - 1
            if 0 <= peer < pp:
                delay = send_s[min(s, peer)] + wake_s
                arrived[(kind, peer, m)] = now + delay
    return done
