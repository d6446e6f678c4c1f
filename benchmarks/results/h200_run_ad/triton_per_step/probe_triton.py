"""Triton GEMM chosen per compiled step (compile(compiler_options=...)), paired with the
process-wide default (XLA_FLAGS turns it off), for a few LM training steps."""
import sys
import time

import jax
import numpy as np

from benchmarks import workloads
from dense_rnn.configs import ptb
from dense_rnn.train import lm

opt = sys.argv[1] if len(sys.argv) > 1 else "xla_gpu_enable_triton_gemm"
print(jax.devices(), flush=True)
for name in sys.argv[2:] or ["zaremba_small", "godin_dense_200x4", "zaremba_large"]:
    c = ptb.CONFIGS[name]
    model = lm.make_model(c)
    xs, ys = workloads._lm_data(c, c.batch_size, c.num_steps)
    x, y = jax.device_put((xs, ys))
    carries = model.zero_carries(c.batch_size)
    params = jax.jit(model.init)(jax.random.key(0), x, carries)["params"]
    tx = lm.make_optimizer(c, 100)
    step = lm.make_train_step(model, tx, c.seed, "float32")
    args = (params, tx.init(params), carries)
    built = {}
    for label, options in (("default", None), ("per-step on", {opt: True})):
        t = time.perf_counter()
        low = step.lower(*args, x, y, 0)
        built[label] = low.compile(compiler_options=options) if options else low.compile()
        print(f"{name} {label}: compile {time.perf_counter() - t:.1f} s", flush=True)
    states = {k: [jax.tree.map(lambda a: a.copy(), args), 0] for k in built}
    times = {k: [] for k in built}
    for rep in range(6):
        for k, f in built.items():
            st = states[k]
            n, t = 0, time.perf_counter()
            while True:
                p, o, cr, nll = f(*st[0], x, y, st[1])
                st[0], st[1] = (p, o, cr), st[1] + 1
                n += 1
                if n >= 5 and time.perf_counter() - t > 0.3:
                    break
            jax.block_until_ready(nll)
            if rep:
                times[k].append((time.perf_counter() - t) / n * 1e3)
    med = {k: float(np.median(v)) for k, v in times.items()}
    ratio = [a / b for a, b in zip(times["default"], times["per-step on"], strict=True)]
    print(f"{name}: default {med['default']:.2f} ms, per-step {opt} {med['per-step on']:.2f} ms,"
          f" speed-up {np.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})", flush=True)
