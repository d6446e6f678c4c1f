"""Benchmark workloads: for each, the implementations to time side by side.

An implementation is a builder: called once, it sets up parameters and data and returns a
``step()`` that runs one training (or evaluation) step to completion. Ours go through the
library's own trainer functions (``dense_rnn.train.lm`` / ``.classify``), i.e. exactly what
the ``experiments`` binaries run; the stack workloads call the layers as a user who imports
them does.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax import Array
from jax.experimental import rnn

from benchmarks import flops, peers
from dense_rnn import cells, precision, stack
from dense_rnn.configs import ptb
from dense_rnn.configs.classifier import ClassifierConfig
from dense_rnn.configs.dc_bilstm import dense_features
from dense_rnn.dense_block import DenseRecurrent
from dense_rnn.train import classify, lm

Step = Callable[[], None]
Builder = Callable[[], Step]
OURS = "ours"
GEMM = "gemm"  # implementation names starting with this are rooflines
PORT = "lax.scan port"
FLAX = "flax nn.RNN"
LR_STEPS_PER_EPOCH = 1000  # only shapes the learning-rate schedule


@dataclasses.dataclass(frozen=True)
class Workload:
    """A step shape: ``items`` tokens (or examples) and ``flops`` per step, and its builders.

    ``gemm_flops`` is the FLOP count of one roofline product (implementations named
    ``gemm*``)."""

    name: str
    unit: str
    items: int
    flops: int
    gemm_flops: int
    impls: dict[str, Builder]
    lm: bool = False  # a language model's step, which issue #5's LM targets are set for


def _jax_loop(fn: Callable, state: list, compiled: Callable[[list], jax.stages.Compiled]
              ) -> Step:
    """A step that feeds ``state`` through ``fn(*state) -> (new_state, result)``;
    ``step.hlo_text()`` is the optimized HLO of the jitted function it runs,
    ``compiled(state)`` (``benchmarks.profile`` names its kernels' operations from it)."""

    def step() -> None:
        state[:], out = fn(*state)
        jax.block_until_ready(out)

    step.hlo_text = lambda: compiled(state).as_text()
    return step


def gemm_impls(m: int, k: int, n: int, dtype: str = "float32") -> dict[str, Builder]:
    """The roofline: one ``(m, k) @ (k, n)`` product of ``dtype`` operands in XLA (as the
    library runs it: ``precision.matmul``, accumulated and returned in float32) and in
    PyTorch."""

    def xla() -> Step:
        a, b = jnp.ones((m, k), dtype), jnp.ones((k, n), dtype)
        f = jax.jit(precision.matmul)
        return lambda: jax.block_until_ready(f(a, b))

    def torch_mm() -> Step:
        import torch

        dev, sync = torch_device()
        kw = {"dtype": getattr(torch, dtype), "device": dev}
        a, b, out = torch.ones(m, k, **kw), torch.ones(k, n, **kw), torch.empty(m, n, **kw)

        def step() -> None:
            torch.mm(a, b, out=out)
            sync()

        return step

    return {f"{GEMM} xla": xla, f"{GEMM} torch": torch_mm}


def torch_device() -> tuple[str, Callable[[], None]]:
    """PyTorch's device, the GPU where there is one (there ``nn.LSTM`` is cuDNN's), and a
    function that waits for the work queued on it.

    On a GPU, PyTorch's float32 products are allowed TF32 like JAX's default precision
    there (cuDNN's LSTM in PyTorch already is, by default)."""
    import torch

    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        return "cuda", torch.cuda.synchronize
    return "cpu", lambda: None


def _lm_data(c: ptb.LMConfig, batch: int, time: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, c.vocab_size, (batch, time + 1), dtype=np.int32)
    return ids[:, :-1], ids[:, 1:]


def lm_workload(name: str, train: bool = True, dtype: str = "float32") -> Workload:
    """A PTB config's training step at its own (batch, num_steps), or its evaluation step
    at (eval_batch_size, num_steps). With ``dtype="bfloat16"`` every implementation computes
    in bfloat16 with float32 parameters: ours and Flax through ``compute_dtype``, PyTorch
    under ``torch.autocast``."""
    c = ptb.CONFIGS[name]
    batch, time = (c.batch_size if train else c.eval_batch_size), c.num_steps
    xs, ys = _lm_data(c, batch, time)
    key = jax.random.key(c.seed)
    zero_carries = lm.make_model(c).zero_carries  # every JAX implementation's carries

    def jax_impl(model, sparse_embedding: bool = False) -> Step:
        """``model``'s step; ``sparse_embedding``: the binaries' (ours), which a peer's
        model, without ``embedded=``, cannot take: its step forms the table's gradient."""
        x, y = jax.device_put((xs, ys))  # on the device once, as PyTorch's tensors are
        # one compiled computation, as the binary's ``lm.init_params``: eagerly, every
        # operation of the model's first call would compile on its own
        params = jax.jit(model.init)(key, x, zero_carries(batch))["params"]
        if not train:
            eval_step = lm.make_eval_step(model, dtype)

            def evaluate(carries):
                carries, nll = eval_step(params, carries, x, y)
                return [carries], nll

            return _jax_loop(evaluate, [zero_carries(batch)],
                             lambda st: eval_step.lower(params, *st, x, y).compile())
        tx = lm.make_optimizer(c, LR_STEPS_PER_EPOCH)
        train_step = lm.make_train_step(model, tx, c.seed, dtype,
                                        sparse_embedding=sparse_embedding)

        def fn(p, o, cr, i):
            p, o, cr, nll = train_step(p, o, cr, x, y, i)
            return [p, o, cr, i + 1], nll

        return _jax_loop(fn, [params, tx.init(params), zero_carries(batch), 0],
                         lambda st: train_step.lower(*st[:3], x, y, st[3]).compile())

    def torch_impl() -> Step:
        import torch

        torch.manual_seed(c.seed)
        dev, sync = torch_device()
        model = peers.torch_lm(c.vocab_size, c.embed_size, c.hidden_size, c.num_layers,
                               c.connectivity, c.dropout_rate).to(dev)
        tx, ty = (torch.from_numpy(a).long().to(dev) for a in (xs, ys))
        n_lstm = len(model.lstms)
        layers = 1 if c.connectivity == "dense" else c.num_layers
        carries = [(torch.zeros(layers, batch, c.hidden_size, device=dev),) * 2
                   for _ in range(n_lstm)]
        opt = torch.optim.SGD(model.parameters(), lr=c.learning_rate)
        model.train(train)
        autocast = torch.autocast(dev, torch.bfloat16, enabled=dtype == "bfloat16")

        def step() -> None:
            if not train:
                with torch.no_grad(), autocast:
                    logits, new = model(tx, carries)
                    torch.nn.functional.cross_entropy(
                        logits.reshape(-1, c.vocab_size), ty.reshape(-1), reduction="sum")
            else:
                opt.zero_grad(set_to_none=True)
                with autocast:
                    logits, new = model(tx, carries)
                    loss = torch.nn.functional.cross_entropy(
                        logits.reshape(-1, c.vocab_size), ty.reshape(-1), reduction="sum") / batch
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), c.max_grad_norm)
                opt.step()
            carries[:] = [(h.detach(), s.detach()) for h, s in new]
            sync()

        return step

    shape = (c.vocab_size, c.embed_size, c.hidden_size, c.num_layers, c.connectivity,
             c.dropout_rate, c.init_scale)
    peer_impls = {FLAX: lambda: jax_impl(peers.FlaxLSTMLM(*shape)),
                  "torch nn.LSTM": torch_impl}
    if jax.default_backend() == "gpu" and dtype == "float32":
        peer_impls["jax cuDNN rnn.lstm"] = lambda: jax_impl(
            peers.FlaxLSTMLM(*shape, lstm=rnn.lstm))
    factor = flops.TRAIN_FACTOR if train else 1
    suffix = "" if dtype == "float32" else f" {dtype}"
    return Workload(
        name=f"{name} {'train' if train else 'eval'} B={batch} T={time}{suffix}",
        unit="tok/s", items=batch * time, flops=factor * flops.lm_forward(c, batch, time),
        gemm_flops=flops.matmul(*flops.lm_softmax_shape(c, batch, time)),
        impls={OURS: lambda: jax_impl(lm.make_model(c), sparse_embedding=True), **peer_impls,
               **gemm_impls(*flops.lm_softmax_shape(c, batch, time), dtype)},
        lm=True,
    )


def stack_workload(name: str) -> Workload:
    """A stacked PTB config's LSTM layers alone, as a user who imports them runs them: at
    its training ``(batch, num_steps)``, no dropout, the forward pass and the gradients of
    every weight and of the input of ``sum(h_L * r)`` (``r`` fixed and random); no
    embedding, softmax or optimizer. Ours (``stack.RecurrentStack``) against Flax's
    ``nn.RNN(nn.OptimizedLSTMCell)`` layers and PyTorch's ``nn.LSTM`` (on a GPU also JAX's
    cuDNN ``rnn.lstm``, every layer in one call); the roofline is a layer's input
    projection."""
    c = ptb.CONFIGS[name]
    if c.connectivity != "stacked":
        raise ValueError(f"{name}: stack workloads are of stacked configs")
    batch, time, h = c.batch_size, c.num_steps, c.hidden_size
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, time, c.embed_size), np.float32)
    r = rng.standard_normal((batch, time, h), np.float32)

    def jax_impl(model: nn.Module, top: Callable[[object], Array]) -> Step:
        on_device = jax.device_put((x, r))
        params = jax.jit(model.init)(jax.random.key(c.seed), on_device[0])

        @jax.jit
        def grads(params, x, r):
            return jax.grad(lambda p, x: (top(model.apply(p, x)) * r).sum(), (0, 1))(params, x)

        return _jax_loop(lambda: ([], grads(params, *on_device)), [],
                         lambda _: grads.lower(params, *on_device).compile())

    def torch_impl() -> Step:
        import torch

        torch.manual_seed(c.seed)
        dev, sync = torch_device()
        net = torch.nn.LSTM(c.embed_size, h, c.num_layers, batch_first=True).to(dev)
        tx = torch.from_numpy(x).to(dev).requires_grad_()
        tr = torch.from_numpy(r).to(dev)

        def step() -> None:
            net.zero_grad(set_to_none=True)
            tx.grad = None
            (net(tx)[0] * tr).sum().backward()
            sync()

        return step

    flax_stack = nn.Sequential([nn.RNN(nn.OptimizedLSTMCell(h)) for _ in range(c.num_layers)])
    ours = stack.RecurrentStack("lstm", (h,) * c.num_layers)
    gpu_peers = {}
    if jax.default_backend() == "gpu":
        gpu_peers["jax cuDNN rnn.lstm"] = lambda: jax_impl(
            peers.CudnnLSTMStack(h, c.num_layers, c.init_scale), lambda y: y)
    rows = batch * time
    return Workload(
        name=f"{name} LSTM stack B={batch} T={time}", unit="tok/s", items=rows,
        flops=flops.TRAIN_FACTOR * sum(flops.lstm_layer(rows, c.embed_size if i == 0 else h, h)
                                       for i in range(c.num_layers)),
        gemm_flops=flops.matmul(rows, h, 4 * h),
        impls={OURS: lambda: jax_impl(ours, lambda out: out[1][-1]),
               FLAX: lambda: jax_impl(flax_stack, lambda y: y), "torch nn.LSTM": torch_impl,
               **gpu_peers, **gemm_impls(rows, h, 4 * h)},
    )


def dense_layer_workload(cell: str, batch: int = 32, time: int = 400, features: int = 128,
                         k: int = 2, inputs: int = 300) -> Workload:
    """One dense-block layer alone, as a user who imports it runs it: the first layer of
    HM-DenseRNN / GRU / LSTM 128 (``k = 2``, reading the 300-d embeddings) at IMDB's length,
    ``dense_block.DenseRecurrent`` forward and the gradients of every weight and of the
    input of ``sum(y * r)`` (``r`` fixed and random); against the ``lax.scan`` port of the
    same layer on the same parameters (``peers.naive_dense_cell``). How the dense-block
    kernel is timed alone (``benchmarks.ab``, ``--xla_scans_peer``)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, time, inputs), np.float32)
    r = rng.standard_normal((batch, time, features), np.float32)
    layer = DenseRecurrent(cell, features, k)

    def jax_impl(apply) -> Step:
        on_device = jax.device_put((x, r))
        params = jax.jit(layer.init)(jax.random.key(0), on_device[0])

        @jax.jit
        def grads(params, x, r):
            return jax.grad(lambda p, x: (apply(p, x)[1] * r).sum(), (0, 1))(params, x)

        return _jax_loop(lambda: ([], grads(params, *on_device)), [],
                         lambda _: grads.lower(params, *on_device).compile())

    g = cells.get_cell(cell).gates * features
    rows = batch * time
    return Workload(
        name=f"dense{cell}_layer k={k} B={batch} T={time} H={features}", unit="tok/s",
        items=rows, flops=flops.TRAIN_FACTOR * (flops.matmul(rows, inputs, g)
                                                + flops.matmul(rows, features, g)),
        gemm_flops=flops.matmul(rows, inputs, g),
        impls={OURS: lambda: jax_impl(layer.apply),
               PORT: lambda: jax_impl(peers.dense_layer_port(cell, k)),
               **gemm_impls(rows, inputs, g)},
    )


def classifier_workload(c: ClassifierConfig, batch: int, time: int,
                        ports: dict[str, peers.Port], forward_flops: Callable,
                        gemm_shape: tuple[int, int, int], vocab_size: int = 20_000,
                        num_classes: int = 5, torch_model: Callable | None = None) -> Workload:
    """A classifier config's training step on ``(batch, time)`` tokens with lengths drawn in
    ``[time / 2, time]``, ours against ``ports`` (by name) on the same parameters and
    trainer, and against ``torch_model(vocab_size, num_classes)`` (a PyTorch module,
    ``forward(tokens, lengths) -> logits``, its output layer ``softmax``) as "torch nn.LSTM",
    trained on the config's recipe in its own loop."""
    rng = np.random.default_rng(0)
    data = {
        "tokens": rng.integers(0, vocab_size, (batch, time), dtype=np.int32),
        "lengths": rng.integers(time // 2, time + 1, batch, dtype=np.int32),
        "labels": rng.integers(0, num_classes, batch, dtype=np.int32),
        "weights": np.ones(batch, np.float32),
    }
    model = classify.make_model(c, vocab_size, num_classes)

    def jax_impl(apply_model) -> Step:
        on_device = jax.device_put(data)  # on the device once, as PyTorch's tensors are
        params = classify.init_params(model, jax.random.key(c.seed))
        tx = classify.make_optimizer(c, params)
        train_step, _ = classify.make_steps(apply_model, tx, c)

        def fn(p, o, i):
            p, o, loss, _ = train_step(p, o, on_device, i)
            return [p, o, i + 1], loss

        return _jax_loop(fn, [params, tx.init(params), 0],
                         lambda st: train_step.lower(st[0], st[1], on_device, st[2]).compile())

    def torch_impl() -> Step:
        import torch

        torch.manual_seed(c.seed)
        dev, sync = torch_device()
        net = torch_model(vocab_size, num_classes).to(dev)
        tokens, labels = (torch.from_numpy(data[k]).long().to(dev) for k in ("tokens", "labels"))
        lengths = torch.from_numpy(data["lengths"]).long()  # pack_padded_sequence: on the CPU
        opt = torch.optim.Adam(net.parameters(), lr=c.learning_rate)

        def step() -> None:  # classify.make_steps' loss and make_optimizer's update
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(net(tokens, lengths), labels)
            if c.l2:
                loss = loss + c.l2 * net.softmax.weight.square().sum()
            loss.backward()
            if c.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(net.parameters(), c.max_grad_norm)
            opt.step()
            sync()

        return step

    torch_impls = {} if torch_model is None else {"torch nn.LSTM": torch_impl}
    if c.freeze_embeddings:  # XLA would drop d(input) of the products reading only e
        raise ValueError(f"{c.name}: flops.TRAIN_FACTOR counts the gradient into every "
                         "layer's input, which frozen embeddings leave partly unused; "
                         "benchmark a config that trains its embeddings")
    return Workload(
        name=f"{c.name} train B={batch} T={time}", unit="ex/s", items=batch,
        flops=flops.TRAIN_FACTOR * forward_flops(c, batch, time, num_classes),
        gemm_flops=flops.matmul(*gemm_shape),
        impls={OURS: lambda: jax_impl(model),
               **{name: functools.partial(jax_impl, port) for name, port in ports.items()},
               **torch_impls, **gemm_impls(*gemm_shape)},
    )


def dc_bilstm_workload(batch: int = 200, time: int = 50, dl: int | None = None) -> Workload:
    """The ``dc_bilstm`` config (15 x 13 + 100), or with ``dl`` dense layers (quick runs)."""
    c, _ = classify.get_config("dc_bilstm")
    if dl is not None:
        c = dataclasses.replace(c, name=f"dc_bilstm_dl{dl}", model_args={**c.model_args,
                                                                         "dl": dl})
    a = c.model_args
    features = dense_features(a["dl"], a["dh"], a["th"])
    drops = a["dropout_embed"], a["dropout_pool"]
    top_in = c.embed_size + 2 * a["dl"] * a["dh"]
    return classifier_workload(
        c, batch, time,
        {PORT: peers.dc_bilstm_port(*drops, len(features)),
         FLAX: peers.flax_dc_bilstm_port(features, *drops)},
        flops.dc_bilstm_forward, (batch * time, top_in, 4 * a["th"]),
        torch_model=lambda v, k: peers.torch_dc_bilstm(v, k, c.embed_size, features, *drops))


def hm_workload(config: str = "hm_densegru_128", batch: int = 32, time: int = 400) -> Workload:
    """An HM-Dense* config at IMDB length, against its two ``lax.scan`` ports."""
    c, _ = classify.get_config(config)
    a = c.model_args
    depths, cell = tuple(a["depths"]), a["cell"]
    gates = cells.get_cell(cell).gates
    return classifier_workload(
        c, batch, time, {PORT: peers.hm_port(depths, cell=cell),
                         f"{PORT} (strided)": peers.hm_port(depths, strided=True, cell=cell)},
        flops.hm_forward, (batch * time, c.embed_size, gates * a["features"]))


WORKLOADS: dict[str, Callable[[], Workload]] = {
    "zaremba_small": lambda: lm_workload("zaremba_small"),
    "zaremba_medium": lambda: lm_workload("zaremba_medium"),
    "godin_dense_200x2": lambda: lm_workload("godin_dense_200x2"),
    "godin_dense_200x4": lambda: lm_workload("godin_dense_200x4"),
    # The recurrent layers alone, as imported (not an LM step: no LM targets).
    "zaremba_small_stack": lambda: stack_workload("zaremba_small"),
    "zaremba_medium_stack": lambda: stack_workload("zaremba_medium"),
    # Hidden size 1500: for GPUs (not in FULL: minutes per step on a 2-core CPU).
    "zaremba_large": lambda: lm_workload("zaremba_large"),
    "dc_bilstm": dc_bilstm_workload,
    "hm_densegru": hm_workload,
    "hm_densernn": lambda: hm_workload("hm_densernn_128"),
    "hm_denselstm": lambda: hm_workload("hm_denselstm_128"),
    "denselstm": lambda: hm_workload("denselstm_128"),  # one dense layer, k = 4
    # A dense-block layer alone, as imported (the kernel's own A/Bs).
    "densegru_layer": lambda: dense_layer_workload("gru"),
    "denselstm_layer": lambda: dense_layer_workload("lstm"),
    "eval_zaremba_medium": lambda: lm_workload("zaremba_medium", train=False),
    "eval_godin_dense_200x2": lambda: lm_workload("godin_dense_200x2", train=False),
    # bfloat16 compute (float32 parameters) in every implementation.
    "zaremba_small_bf16": lambda: lm_workload("zaremba_small", dtype="bfloat16"),
    "zaremba_medium_bf16": lambda: lm_workload("zaremba_medium", dtype="bfloat16"),
    "godin_dense_200x2_bf16": lambda: lm_workload("godin_dense_200x2", dtype="bfloat16"),
    # Small shapes for --quick and tests.
    "tiny_lm": lambda: lm_workload("tiny"),
    "dc_bilstm_small": lambda: dc_bilstm_workload(32, 20, dl=2),
    "hm_densegru_small": lambda: hm_workload(batch=8, time=32),
    "hm_denselstm_small": lambda: hm_workload("hm_denselstm_128", batch=8, time=32),
}
FULL = ("zaremba_small", "zaremba_medium", "godin_dense_200x2", "godin_dense_200x4",
        "zaremba_small_stack", "zaremba_medium_stack", "dc_bilstm", "hm_densegru",
        "hm_densernn", "hm_denselstm",
        "eval_zaremba_medium", "eval_godin_dense_200x2",
        "zaremba_small_bf16", "zaremba_medium_bf16", "godin_dense_200x2_bf16")
QUICK = ("zaremba_small", "dc_bilstm_small", "hm_densegru_small")
