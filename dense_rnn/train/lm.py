"""Training and evaluation of the PTB language models (truncated BPTT, Zaremba et al.).

The loss is the cross-entropy summed over the ``num_steps`` time steps and averaged over
the batch (Zaremba's recipe, for which "lr 1, clip 5" is meant); perplexity is
``exp(total NLL / target tokens)``. The hidden state is carried from window to window and
reset at the start of every epoch and every evaluation.

Dropout keys are ``fold_in(key(seed), global_step)``, so a run resumed from a checkpoint
(params, optimizer state, carried state, position in the data) continues bit for bit on a
CPU or TPU; on a GPU only with ``XLA_FLAGS=--xla_gpu_deterministic_ops=true`` (the
embedding's gradient is a scatter-add, whose float sums XLA:GPU orders at random).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from dense_rnn import native, parallel, platform, precision
from dense_rnn.configs.ptb import LMConfig
from dense_rnn.data import ptb
from dense_rnn.errors import Interrupted, UserError
from dense_rnn.models.lm import LanguageModel
from dense_rnn.train import checkpoint, metrics

# Fields that may change when a run is resumed; every other field must match. Not
# ``eval_batch_size``: it sets the validation streams, and early stopping compares new
# validations with the best one.
RESUMABLE_FIELDS = ("max_epochs", "max_steps", "early_stopping_patience", "log_every_steps",
                    "learning_rate", "max_grad_norm", "checkpoint_every_steps", "scan_unroll",
                    "compute_dtype", "num_devices")
# The paper's numbers beside a config: kept with a run, not compared when it resumes.
DESCRIPTIVE_FIELDS = ("paper_params", "paper_valid_ppl", "paper_test_ppl")
# Identity fields that runs of older versions lack (resumable then): not compared with them.
ADDED_FIELDS = ("eval_batch_size",)
# Jitted steps; carries are the per-layer LSTM states of ``LanguageModel``.
TrainStep = Callable[..., tuple[Any, optax.OptState, tuple, jax.Array]]
EvalStep = Callable[..., tuple[tuple, jax.Array]]


def make_model(c: LMConfig) -> LanguageModel:
    """The language model ``c`` describes."""
    return LanguageModel(
        vocab_size=c.vocab_size, embed_size=c.embed_size, hidden_size=c.hidden_size,
        num_layers=c.num_layers, connectivity=c.connectivity, dropout_rate=c.dropout_rate,
        variational=c.variational, init_scale=c.init_scale, scan_unroll=c.scan_unroll,
    )


def init_params(c: LMConfig, key: jax.Array) -> Any:
    """Freshly initialised parameters of ``make_model(c)`` (one compiled computation)."""
    tokens = jnp.zeros((c.batch_size, c.num_steps), jnp.int32)
    return jax.jit(make_model(c).init)(key, tokens)["params"]


def param_shapes(c: LMConfig) -> Any:
    """The shapes and dtypes of ``init_params(c, key)``, computed without initialising."""
    return jax.eval_shape(lambda: init_params(c, jax.random.key(0)))


def num_params(c: LMConfig) -> int:
    """Every parameter of ``make_model(c)`` (counted without initialising it)."""
    return metrics.count_params(param_shapes(c))


def learning_rate_schedule(c: LMConfig, steps_per_epoch: int) -> Callable[[Any], Any]:
    """``lr`` for the first ``decay_after_epochs`` epochs, then ``x lr_decay`` per epoch."""

    def schedule(step: int | jax.Array) -> jax.Array:
        epoch = step // steps_per_epoch
        return c.learning_rate * c.lr_decay ** jnp.maximum(epoch - c.decay_after_epochs + 1, 0)

    return schedule


def make_optimizer(c: LMConfig, steps_per_epoch: int) -> optax.GradientTransformation:
    """SGD on ``learning_rate_schedule`` after global-norm clipping at ``max_grad_norm``."""
    return optax.chain(
        optax.clip_by_global_norm(c.max_grad_norm),
        optax.sgd(learning_rate_schedule(c, steps_per_epoch)),
    )


def make_train_step(model: LanguageModel, tx: optax.GradientTransformation, seed: int,
                    compute_dtype: Any = jnp.float32, mesh: Mesh | None = None,
                    sparse_embedding: bool = False) -> TrainStep:
    """A jitted ``(params, opt_state, carries, x, y, step) -> (params, opt_state, carries,
    nll_sum)``; ``nll_sum`` is the summed NLL of the window (for perplexity). The forward
    pass runs in ``compute_dtype``; with a ``mesh``, parameters and optimizer state stay
    replicated and the carries batch-sharded.

    With ``sparse_embedding`` the embedding table's gradient, zero but for the rows the
    window looks up, is never formed: ``tx`` gets in its place the gradients of those rows
    summed per distinct token (``embedding_rows_gradient``; their global norm is the
    table gradient's), and its update is added to those rows alone. That is the dense step
    for a ``tx`` that scales each gradient by factors shared by all parameters and keeps no
    state per parameter, as ``make_optimizer``'s clipped SGD: the binaries' step, 1.01-1.04x
    faster for it on the PTB configs (a 2-core EPYC, paired), and without the table-sized
    gradient in memory. A ``tx`` that keeps state per parameter is refused; one that reads
    the parameters fails, being given none.
    """
    base_key = jax.random.key(seed)

    def loss_fn(p: Any, carries: tuple, x: jax.Array, y: jax.Array, rng: jax.Array,
                embedded: jax.Array | None = None) -> tuple[jax.Array, tuple[tuple, jax.Array]]:
        rows = {} if embedded is None else {"embedded": embedded.astype(compute_dtype)}
        nll, new_carries = model.apply(  # the float32 carries come back float32
            {"params": precision.cast_floating(p, compute_dtype)}, x, carries, y,
            deterministic=False, rngs={"dropout": rng}, **rows)
        nll = nll.sum()
        return nll / x.shape[0], (new_carries, nll)

    def train_step(params: Any, opt_state: optax.OptState, carries: tuple, x: jax.Array,
                   y: jax.Array, step: jax.Array) -> tuple[Any, optax.OptState, tuple, jax.Array]:
        rng = jax.random.fold_in(base_key, step)
        if not sparse_embedding:
            grads, (carries, nll) = jax.grad(loss_fn, has_aux=True)(params, carries, x, y, rng)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, carries, nll
        table = params["embed"]["embedding"]
        rest = {k: v for k, v in params.items() if k != "embed"}
        (grads, d_rows), (carries, nll) = jax.grad(loss_fn, argnums=(0, 5), has_aux=True)(
            rest, carries, x, y, rng, jnp.take(table, x, axis=0))
        ids, d_table = embedding_rows_gradient(x, d_rows, table.shape[0])
        updates, opt_state = tx.update({**grads, "embed": {"embedding": d_table}}, opt_state)
        rows = updates.pop("embed")["embedding"].astype(table.dtype)
        new = optax.apply_updates(rest, updates)
        new["embed"] = {"embedding": table.at[ids].add(rows, mode="drop")}
        return new, opt_state, carries, nll

    def checked_step(params: Any, opt_state: optax.OptState, *args: Any) -> Any:
        table = params.get("embed", {}).get("embedding")
        if table is None:
            raise ValueError("make_train_step: sparse_embedding needs a LanguageModel's "
                             "parameters (an embedding table at params['embed']['embedding']); "
                             "pass sparse_embedding=False for another model")
        if any(getattr(leaf, "shape", None) == table.shape
               for leaf in jax.tree.leaves(opt_state)):
            raise ValueError("make_train_step: sparse_embedding needs an optimizer that keeps "
                             "no state per parameter (SGD, clipped or not: make_optimizer); "
                             "this one keeps the embedding table's shape in its state")
        return train_step(params, opt_state, *args)

    step = checked_step if sparse_embedding else train_step
    if mesh is None:
        return jax.jit(step, donate_argnums=(0, 1, 2))
    rep = parallel.replicated(mesh)
    return jax.jit(step, donate_argnums=(0, 1, 2),
                   out_shardings=(rep, rep, parallel.batch_sharded(mesh), rep))


def embedding_rows_gradient(tokens: jax.Array, d_rows: jax.Array,
                            vocab_size: int) -> tuple[jax.Array, jax.Array]:
    """The embedding table's gradient from those of the rows ``tokens`` looked up
    (``d_rows``, (*tokens.shape, E)): ``(ids, rows)``, the distinct tokens (padded to
    ``tokens.size`` with ``vocab_size``, past the table) and each one's rows' gradients
    summed ((tokens.size, E); zero at the padding)."""
    flat = tokens.reshape(-1)
    ids, where = jnp.unique(flat, size=flat.size, fill_value=vocab_size, return_inverse=True)
    rows = jax.ops.segment_sum(d_rows.reshape(flat.size, -1), where.reshape(-1),
                               num_segments=flat.size)
    return ids, rows


def make_eval_step(model: LanguageModel, compute_dtype: Any = jnp.float32) -> EvalStep:
    """A jitted ``(params, carries, x, y) -> (carries, nll_sum)``, deterministic (no dropout);
    the forward pass runs in ``compute_dtype``."""

    def eval_step(params: Any, carries: tuple, x: jax.Array,
                  y: jax.Array) -> tuple[tuple, jax.Array]:
        nll, carries = model.apply({"params": precision.cast_floating(params, compute_dtype)},
                                   x, carries, y, deterministic=True)
        return carries, nll.sum()

    return jax.jit(eval_step)


def perplexity(mean_nll: float) -> float:
    """``exp(mean_nll)``, ``inf`` where that overflows a float (a diverging loss)."""
    try:
        return math.exp(mean_nll)
    except OverflowError:
        return math.inf


def evaluate(model: LanguageModel, eval_step: EvalStep, params: Any, ids: np.ndarray,
             batch: int, num_steps: int, mesh: Mesh | None = None) -> float:
    """Perplexity of ``params`` on ``ids``, state carried across windows from zero; with a
    ``mesh``, windows are batch-sharded over it where the batch splits evenly."""
    streams = ptb.batchify(ids, batch)
    sharding = None if mesh is None else parallel.eval_sharding(batch, mesh)

    def place(tree: Any) -> Any:
        return tree if sharding is None else parallel.put(tree, sharding)

    carries = place(model.zero_carries(batch))
    total, pace = jnp.zeros(()), parallel.Pacer(mesh)
    for i in range(ptb.num_windows(streams, num_steps, drop_remainder=False)):
        x, y = place(ptb.window(streams, i, num_steps))
        carries, nll = eval_step(params, carries, x, y)
        total = total + pace(nll)
    return perplexity(float(total) / (batch * (streams.shape[1] - 1)))


def _format_eta(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


@dataclasses.dataclass
class Progress:
    """Where a run stands; saved with every checkpoint."""

    epoch: int = 0  # epochs completed
    step_in_epoch: int = 0
    global_step: int = 0
    best_valid_ppl: float = float("inf")
    best_epoch: float = 0  # epochs trained at the best validation (fractional: a mid-epoch stop)
    bad_epochs: int = 0
    # the best validation at an epoch's end, early stopping's baseline: a mid-epoch stop's
    # validation (``max_steps``) may become the best but does not move it (None: a record
    # from before this field, whose baseline was ``best_valid_ppl``)
    epoch_end_best_valid_ppl: float | None = None
    train_seconds: float = 0.0
    train_tokens: int = 0
    wall_seconds: float = 0.0
    done: bool = False  # early-stopped
    epoch_nll: float = 0.0  # the current epoch's summed training NLL so far
    epoch_tokens: int = 0  # and its target tokens
    steps_per_epoch: int = 0  # of the training split the run started on (0: not recorded)


def train_and_evaluate(c: LMConfig, data_dir: str | None, workdir: str,
                       hf_dataset: str | None = None, log: Callable[[str], None] = print,
                       should_stop: Callable[[], bool] = lambda: False,
                       check_sizes: bool = True, command: str | None = None) -> dict[str, Any]:
    """Trains ``c`` (resuming from ``workdir`` if it holds a checkpoint), then reports the
    test perplexity of the best-validation parameters. Returns the summary, written to
    ``summary.json`` with ``command`` (the binary's command line, ``cli.command_line``)
    where given.

    ``should_stop`` is asked after every step; once it says so, the run checkpoints that
    step and raises ``Interrupted`` (``cli.stop_on_signals`` ties it to Ctrl-C). Local splits
    of other sizes than Mikolov's are warned about when a run starts, unless
    ``check_sizes`` is False (a deliberate excerpt). glibc's malloc is set to keep freed
    buffers, as the binaries set it (``platform.fast_malloc``)."""
    platform.fast_malloc()  # from Python (a notebook): no re-exec set it
    wall_start = time.time()
    identity = {k: v for k, v in c.to_dict().items() if k not in RESUMABLE_FIELDS}
    if runs := checkpoint.runs_below(workdir):  # its summary.json is theirs
        raise UserError(f"{workdir} holds other runs in {', '.join(runs[:3])}"
                        f"{', ...' if len(runs) > 3 else ''} (a classifier's folds or sweep, "
                        "or a table driver's root); use a new --workdir")
    corpus = ptb.load_ptb(data_dir, hf_dataset)
    if len(corpus.vocab) > c.vocab_size:
        raise UserError(f"the corpus has {len(corpus.vocab)} word types but the config's "
                        f"vocab_size is {c.vocab_size}; pass --vocab_size={len(corpus.vocab)}")
    # what the devices and splits refuse, before anything is written to the workdir
    mesh = parallel.make_mesh(c.num_devices)
    parallel.check_batch(c.batch_size, mesh)
    replicated, batch_sharded = parallel.replicated(mesh), parallel.batch_sharded(mesh)
    compute_dtype = precision.compute_dtype(c.compute_dtype)
    train_streams = ptb.batchify(corpus.train, c.batch_size, "the training split",
                                 "--batch_size")
    steps_per_epoch = ptb.num_windows(train_streams, c.num_steps, drop_remainder=True)
    if steps_per_epoch < 1:
        raise UserError(f"the training split is too short for batch {c.batch_size} x "
                        f"num_steps {c.num_steps}")
    for name, split in (("valid", corpus.valid), ("test", corpus.test)):  # not after training
        ptb.batchify(split, c.eval_batch_size, f"the {name} split", "--eval_batch_size")
    with checkpoint.Checkpointer(workdir, identity, descriptive=DESCRIPTIVE_FIELDS,
                                 added=ADDED_FIELDS) as ckpt:
        vocab_path = os.path.join(workdir, ptb.VOCAB_FILE)  # for lm_infer
        ckpt.keep_data_file(vocab_path, ptb.read_vocab,
                            lambda path: ptb.write_vocab(path, corpus.vocab), corpus.vocab,
                            f"{workdir} was trained on another corpus (its {ptb.VOCAB_FILE} "
                            "differs from this --data_dir's vocabulary); pass the run's "
                            "--data_dir or use a new --workdir")
        model = make_model(c)
        tx = make_optimizer(c, steps_per_epoch)
        params = init_params(c, jax.random.key(c.seed))
        state = {"params": parallel.put(params, replicated),
                 "opt_state": parallel.put(tx.init(params), replicated),
                 "carries": parallel.put(model.zero_carries(c.batch_size), batch_sharded)}
        state, progress = ckpt.resume(state, Progress())
        if progress.epoch_end_best_valid_ppl is None:
            progress.epoch_end_best_valid_ppl = progress.best_valid_ppl
        if not ckpt.best_readable(state["params"]) or not ckpt.has_best():
            # none left that the progress record could name (set aside as unreadable, gone
            # with the damaged latest checkpoint that saved it, deleted): chosen anew
            progress.best_valid_ppl, progress.best_epoch = float("inf"), 0
        checkpoint.check_steps_per_epoch(workdir, progress, steps_per_epoch)
        ckpt.keep_data_digests(checkpoint.data_digests(
            {"train": [corpus.train], "valid": [corpus.valid], "test": [corpus.test]}),
            "pass the run's --data_dir (or --hf_dataset) or use a new --workdir")
        progress.done = checkpoint.early_stopped(progress.bad_epochs, c.early_stopping_patience)
        finished = checkpoint.finished_because(progress.done, progress.epoch, c.max_epochs,
                                               progress.global_step, c.max_steps)
        if ckpt.latest_step() is None:  # the sizes are checked once, when the run starts
            if check_sizes and not hf_dataset and (warning := ptb.size_warning(corpus)):
                log(warning)
        else:
            log(checkpoint.resume_line(workdir, progress.global_step, progress.epoch,
                                       f"step {progress.step_in_epoch}/{steps_per_epoch}",
                                       finished))
        n_params = metrics.count_params(state["params"])
        log(f"config {c.name}: {n_params:,} parameters, {steps_per_epoch} steps/epoch, "
            f"device {metrics.device_description(mesh.size)}, data parallel over {mesh.size}, "
            f"{c.compute_dtype} compute{native.note(c.compute_dtype)}")
        writer = metrics.MetricsWriter(workdir, progress.global_step)
        train_step = make_train_step(model, tx, c.seed, compute_dtype, mesh,
                                     sparse_embedding=True)
        eval_step = make_eval_step(model, compute_dtype)

        wall_before = progress.wall_seconds

        def save() -> None:
            progress.wall_seconds = wall_before + time.time() - wall_start
            ckpt.save_progress(state, progress, c.to_dict())

        def valid_and_record() -> float:
            ppl = evaluate(model, eval_step, state["params"], corpus.valid, c.eval_batch_size,
                           c.num_steps, mesh)
            if not math.isfinite(ppl):  # a finite loss too large for exp(): diverged too
                raise metrics.not_finite_error(ppl, f"after step {progress.global_step}",
                                               workdir, ckpt.latest_step(), RESUMABLE_FIELDS,
                                               "validation perplexity", discarded=False)
            train_ppl = perplexity(progress.epoch_nll / max(progress.epoch_tokens, 1))
            lr = float(learning_rate_schedule(c, steps_per_epoch)(max(progress.global_step - 1, 0)))
            epoch = progress.epoch + progress.step_in_epoch / steps_per_epoch
            writer.write({"step": progress.global_step, "epoch": round(epoch, 4),
                          "train_ppl": train_ppl, "valid_ppl": ppl, "learning_rate": lr})
            log(f"epoch {epoch:.2f} step {progress.global_step}: train ppl {train_ppl:.2f} "
                f"valid ppl {ppl:.2f} lr {lr:.4g}")
            if ppl < progress.best_valid_ppl:
                record_best(ppl, state["params"])
            return ppl

        def record_best(ppl: float, params: Any) -> None:
            """``params``, validated at ``ppl`` now, as the run's best."""
            progress.best_valid_ppl = ppl
            progress.best_epoch = (round(progress.epoch + progress.step_in_epoch
                                         / steps_per_epoch, 4) if progress.step_in_epoch
                                   else progress.epoch)
            ckpt.save_best(progress.global_step, params, {"valid_ppl": ppl})

        tokens_per_step = c.batch_size * c.num_steps
        compiled = False
        stop, pace = finished is not None, parallel.Pacer(mesh)
        while not stop and progress.epoch < c.max_epochs:
            if progress.step_in_epoch == 0:
                state["carries"] = parallel.put(model.zero_carries(c.batch_size), batch_sharded)
                progress.epoch_nll, progress.epoch_tokens = 0.0, 0
            pending, timed_steps, t0 = [], 0, time.time()  # per-step NLLs not yet read back
            window_nll, window_steps = 0.0, 0  # since the last log line (or resume, epoch)
            while progress.step_in_epoch < steps_per_epoch and not stop:
                x, y = parallel.put(ptb.window(train_streams, progress.step_in_epoch, c.num_steps),
                                    batch_sharded)
                state["params"], state["opt_state"], state["carries"], nll = train_step(
                    state["params"], state["opt_state"], state["carries"], x, y,
                    progress.global_step)
                pending.append(pace(nll))
                progress.step_in_epoch += 1
                progress.global_step += 1
                if not compiled:  # the first step compiles: keep it out of the throughput
                    jax.block_until_ready(nll)
                    compiled, t0 = True, time.time()
                else:
                    timed_steps += 1
                stop = bool(c.max_steps) and progress.global_step >= c.max_steps
                interrupt = not stop and should_stop()
                at_log = progress.global_step % c.log_every_steps == 0
                at_ckpt = interrupt or bool(c.checkpoint_every_steps) and (
                    progress.global_step % c.checkpoint_every_steps == 0)
                if not (at_log or at_ckpt or stop or progress.step_in_epoch == steps_per_epoch):
                    continue
                nlls = np.asarray(jnp.stack(pending), np.float64)  # waits for the device
                bad = np.flatnonzero(~np.isfinite(nlls))
                if bad.size:  # step k's loss is that of the weights after step k - 1
                    k = progress.global_step - len(nlls) + 1 + int(bad[0])
                    raise metrics.not_finite_error(nlls[bad[0]], f"at step {k}", workdir,
                                                   ckpt.discard_from(k - 1), RESUMABLE_FIELDS)
                for step_nll in nlls:  # one by one: the same sum wherever a resume cut the epoch
                    progress.epoch_nll += float(step_nll)
                window_nll, window_steps = window_nll + float(nlls.sum()), window_steps + len(nlls)
                dt = time.time() - t0
                progress.train_seconds += dt
                progress.train_tokens += timed_steps * tokens_per_step
                progress.epoch_tokens += len(nlls) * tokens_per_step
                if at_log:
                    rate = timed_steps * tokens_per_step / max(dt, 1e-9)
                    left = ((c.max_epochs - progress.epoch) * steps_per_epoch
                            - progress.step_in_epoch)
                    if c.max_steps:
                        left = min(left, c.max_steps - progress.global_step)
                    eta = _format_eta(left * tokens_per_step / rate) if rate else "?"
                    log(f"epoch {progress.epoch + 1} step {progress.step_in_epoch}/"
                        f"{steps_per_epoch} loss {window_nll / (window_steps * c.batch_size):.3f} "
                        f"ppl {perplexity(window_nll / (window_steps * tokens_per_step)):.2f} "
                        f"{rate:,.0f} tok/s ETA {eta}")
                    window_nll, window_steps = 0.0, 0
                # Restarted before a checkpoint: its write counts in the next set's rate.
                pending, timed_steps, t0 = [], 0, time.time()
                if at_ckpt and not stop and progress.step_in_epoch < steps_per_epoch:
                    save()
                    if interrupt:
                        raise Interrupted(progress.global_step)
            if progress.step_in_epoch == steps_per_epoch:
                progress.epoch += 1
                progress.step_in_epoch = 0
                ppl = valid_and_record()
                improved = ppl < progress.epoch_end_best_valid_ppl
                progress.epoch_end_best_valid_ppl = min(ppl, progress.epoch_end_best_valid_ppl)
                progress.bad_epochs = 0 if improved else progress.bad_epochs + 1
                if checkpoint.early_stopped(progress.bad_epochs, c.early_stopping_patience):
                    log(f"early stopping: no better valid ppl for {progress.bad_epochs} epochs")
                    progress.done = stop = True
            else:  # stopped mid-epoch by max_steps: a candidate for the best, no epoch's end
                valid_and_record()
            save()
            if not stop and progress.epoch < c.max_epochs and should_stop():
                raise Interrupted(progress.global_step)  # asked at an epoch's end

        ckpt.wait()
        best = ckpt.restore_best(state["params"])
        best_params = best[0] if best is not None else state["params"]
        if best is None and progress.global_step and math.isinf(progress.best_valid_ppl):
            # its best checkpoints were unreadable and no validation since has improved on inf
            record_best(evaluate(model, eval_step, best_params, corpus.valid,
                                 c.eval_batch_size, c.num_steps, mesh), best_params)
            save()  # the progress record that names them
            log("no best checkpoint is left: the latest parameters stand for the best")
        test_ppl = evaluate(model, eval_step, best_params, corpus.test, c.eval_batch_size,
                            c.num_steps, mesh)
        log(f"test ppl {test_ppl:.2f} (best valid ppl {progress.best_valid_ppl:.2f}, "
            f"epoch {progress.best_epoch})")
        summary = {
            "config": checkpoint.reported_config(c.to_dict(), ckpt.resumed_config, finished),
            "num_params": n_params,
            "best_valid_ppl": progress.best_valid_ppl, "test_ppl": test_ppl,
            "best_epoch": progress.best_epoch, "epochs_completed": progress.epoch,
            "steps": progress.global_step,
            "train_tokens_per_second": progress.train_tokens / max(progress.train_seconds, 1e-9),
            "train_seconds": progress.train_seconds,
            "wall_seconds": wall_before + time.time() - wall_start,
            "device": metrics.device_description(mesh.size), "data_parallel_devices": mesh.size,
            "versions": metrics.versions(),
            "paper": {"params": c.paper_params, "valid_ppl": c.paper_valid_ppl,
                      "test_ppl": c.paper_test_ppl},
        }
        if command is not None:
            summary["command"] = command
        metrics.write_json(os.path.join(workdir, "summary.json"), summary)
        metrics.plot_curves(writer.records, ["train_ppl", "valid_ppl"],
                            os.path.join(workdir, "curves.png"), f"{c.name} on PTB", log_y=True)
        writer.close()
    return summary

