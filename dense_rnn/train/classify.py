"""Training and evaluation of sentence classifiers (Ding et al. 2018's recipe by default).

Adam (lr 0.005), batches of 200 bucketed by length, cross-entropy plus
``l2 * ||W_softmax||^2`` (the ``softmax`` submodule's kernel), dropout keys
``fold_in(key(seed), global_step)`` and epoch shuffles seeded by ``(seed, epoch)``, so a
run resumed from its last checkpoint (written after every epoch and, with
``checkpoint_every_steps``, every that many steps within one) continues bit for bit on a
CPU or TPU (on a GPU, with ``XLA_FLAGS=--xla_gpu_deterministic_ops=true``).

Model selection: the test accuracy reported is that of the epoch with the best dev
accuracy. ``select="test"`` reports instead the best test accuracy seen during training
(Ding et al.'s protocol, optimistic), and says so in every output.

Config families: every module in ``FAMILIES`` (``dense_rnn/configs/families.py``) provides
``CONFIGS``, ``paper_param_count(config)`` and ``paper_accuracy(name, dataset)``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util
from jax.sharding import Mesh

from dense_rnn import files, native, parallel, platform, precision
from dense_rnn.configs.classifier import ClassifierConfig
from dense_rnn.configs.families import all_configs as all_configs
from dense_rnn.configs.families import get_config as get_config
from dense_rnn.data import text_classification as tc
from dense_rnn.data.glove import load_glove
from dense_rnn.errors import Interrupted, UserError
from dense_rnn.models import CLASSIFIERS
from dense_rnn.train import checkpoint, metrics

# Fields that may change when a run is resumed; every other field must match.
RESUMABLE_FIELDS = ("max_epochs", "early_stopping_patience", "checkpoint_every_steps",
                    "compute_dtype", "num_devices")
DESCRIPTIVE_FIELDS = ("paper",)  # the paper's row beside a config: not compared on resume
SELECTIONS = {
    "dev": "test accuracy at the epoch with the best dev accuracy",
    "test": "best test accuracy seen during training (Ding et al.'s protocol; optimistic)",
}
EMBED_INIT_SCALE = 0.25  # uniform init of words without a pretrained vector (Kim 2014)
Batch = dict[str, jax.Array]  # tokens, lengths, labels, weights (see tc.batches)
TrainStep = Callable[..., tuple[Any, optax.OptState, jax.Array, jax.Array]]
EvalStep = Callable[..., jax.Array]


def make_model(c: ClassifierConfig, vocab_size: int, num_classes: int) -> nn.Module:
    """The classifier ``c.model`` names, for this vocabulary and number of classes."""
    if c.model not in CLASSIFIERS:
        raise UserError(f"config {c.name} names unknown model {c.model!r}; known: "
                        f"{', '.join(CLASSIFIERS)}")
    return CLASSIFIERS[c.model](vocab_size=vocab_size, num_classes=num_classes,
                                embed_size=c.embed_size, **c.model_args)


def init_params(model: nn.Module, key: jax.Array) -> Any:
    """Freshly initialised parameters of a classifier built by ``make_model`` (one compiled
    computation: eagerly, every initializer of a deep model compiles on its own)."""
    tokens, lengths = jnp.zeros((1, 4), jnp.int32), jnp.ones((1,), jnp.int32)
    return jax.jit(model.init)(key, tokens, lengths)["params"]


def param_shapes(model: nn.Module) -> Any:
    """The shapes and dtypes of ``init_params(model, key)``, computed without initialising."""
    return jax.eval_shape(lambda: init_params(model, jax.random.key(0)))


def num_params_without_embedding(c: ClassifierConfig, num_classes: int) -> int:
    """Every parameter except the embedding table (which depends on the vocabulary)."""
    shapes = param_shapes(make_model(c, 1, num_classes))
    return metrics.count_params(shapes) - c.embed_size


def _is_embedding(path: tuple[str, ...]) -> bool:
    return path[0] == "embed"


def make_optimizer(c: ClassifierConfig, params: Any) -> optax.GradientTransformation:
    """Adam (optionally after global-norm clipping); a frozen embedding gets no updates."""
    adam = optax.chain(optax.clip_by_global_norm(c.max_grad_norm) if c.max_grad_norm
                       else optax.identity(), optax.adam(c.learning_rate))
    if not c.freeze_embeddings:
        return adam
    labels = traverse_util.path_aware_map(
        lambda path, _: "frozen" if _is_embedding(path) else "train", params)
    return optax.multi_transform({"train": adam, "frozen": optax.set_to_zero()}, labels)


def softmax_l2(params: Any) -> jax.Array:
    """``||W||^2`` of the softmax layer's kernel (Ding et al.'s L2 on the softmax)."""
    if "softmax" not in params:
        raise ValueError("a classifier's output layer must be a submodule named 'softmax'")
    return jnp.sum(jnp.square(params["softmax"]["kernel"]))


def make_steps(model: nn.Module, tx: optax.GradientTransformation, c: ClassifierConfig,
               mesh: Mesh | None = None) -> tuple[TrainStep, EvalStep]:
    """Jitted ``train_step(params, opt_state, batch, step) -> (params, opt_state, loss_sum,
    correct)`` and ``eval_step(params, batch) -> correct``; sums are over real rows. The
    forward pass runs in ``c.compute_dtype``; with a ``mesh``, parameters and optimizer
    state stay replicated."""
    base_key = jax.random.key(c.seed)
    dtype = precision.compute_dtype(c.compute_dtype)

    def apply(params: Any, batch: Batch, **kw: Any) -> jax.Array:
        logits = model.apply({"params": precision.cast_floating(params, dtype)},
                             batch["tokens"], batch["lengths"], **kw)
        return logits.astype(jnp.float32)

    def train_step(params: Any, opt_state: optax.OptState, batch: Batch,
                   step: jax.Array) -> tuple[Any, optax.OptState, jax.Array, jax.Array]:
        rng = jax.random.fold_in(base_key, step)

        def loss_fn(p: Any) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
            logits = apply(p, batch, deterministic=False, rngs={"dropout": rng})
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
            ce_sum = jnp.sum(ce * batch["weights"])
            loss = ce_sum / jnp.maximum(batch["weights"].sum(), 1.0)
            if c.l2:
                loss = loss + c.l2 * softmax_l2(p)
            return loss, (ce_sum, _correct(logits, batch))

        grads, (ce_sum, correct) = jax.grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, ce_sum, correct

    def eval_step(params: Any, batch: Batch) -> jax.Array:
        return _correct(apply(params, batch), batch)

    out = {} if mesh is None else {"out_shardings": parallel.replicated(mesh)}
    return jax.jit(train_step, donate_argnums=(0, 1), **out), jax.jit(eval_step, **out)


def _correct(logits: jax.Array, batch: Batch) -> jax.Array:
    return jnp.sum((jnp.argmax(logits, -1) == batch["labels"]) * batch["weights"])


@dataclasses.dataclass(frozen=True)
class Encoded:
    """One train/dev/test split as word ids, with its vocabulary and initial embeddings."""

    ids: dict[str, list[np.ndarray]]
    labels: dict[str, np.ndarray]
    vocab: tc.Vocab
    embeddings: np.ndarray | None  # (vocab, dim) initial table, or None (random init)


def encode(splits: tc.Splits, vectors: dict[str, np.ndarray] | None, oov: str,
           seed: int) -> Encoded:
    """Vocabulary, word ids and the initial embedding table of one split."""
    vocab = tc.build_vocab(splits, None if vectors is None else set(vectors), oov)
    ids = {k: vocab.encode(ds["tokens"]) for k, ds in splits.items()}
    labels = {k: np.asarray(ds["label"], np.int32) for k, ds in splits.items()}
    table = None
    if vectors is not None:
        dim = len(next(iter(vectors.values())))
        rng = np.random.default_rng(seed)
        table = rng.uniform(-EMBED_INIT_SCALE, EMBED_INIT_SCALE,
                            (len(vocab.words), dim)).astype(np.float32)
        table[tc.PAD] = 0.0
        for i, w in enumerate(vocab.words):
            if w in vectors:
                table[i] = vectors[w]
    return Encoded(ids, labels, vocab, table)


def accuracy(eval_step: EvalStep, params: Any, ids: Sequence[np.ndarray], labels: np.ndarray,
             batch_size: int, mesh: Mesh | None = None) -> float:
    """Accuracy over ``ids``; with a ``mesh``, each batch is split over it."""
    place = (lambda b: b) if mesh is None else (
        lambda b: parallel.put(b, parallel.batch_sharded(mesh)))
    pace = parallel.Pacer(mesh)
    correct = sum(pace(eval_step(params, place(b))) for b in tc.batches(ids, labels, batch_size))
    return float(correct) / max(len(ids), 1)


@dataclasses.dataclass
class Progress:
    """Where a run stands; saved with every checkpoint."""

    epoch: int = 0  # epochs completed
    step_in_epoch: int = 0  # steps done of the next epoch
    epoch_ce_sum: float = 0.0  # its training sums so far (float32 values, exact as floats)
    epoch_correct: float = 0.0
    global_step: int = 0
    best_dev: float = -1.0
    best_dev_epoch: int = 0
    # the best dev accuracy early stopping compares with; unlike best_dev, it stays when
    # unreadable best parameters are chosen anew (None: a record from before this field)
    stopping_best_dev: float | None = None
    test_at_best_dev: float = 0.0
    best_test: float = -1.0
    best_test_epoch: int = 0
    bad_epochs: int = 0
    wall_seconds: float = 0.0
    done: bool = False  # early-stopped
    steps_per_epoch: int = 0  # of the training split the run started on (0: not recorded)


def train_split(c: ClassifierConfig, data: Encoded, num_classes: int, workdir: str,
                identity: dict[str, Any], log: Callable[[str], None] = print,
                title: str = "", should_stop: Callable[[], bool] = lambda: False
                ) -> dict[str, Any]:
    """Trains ``c`` on one train/dev/test split (resuming from ``workdir``); returns its
    record: dev/test accuracies, epochs, parameter counts, wall time. ``should_stop`` is
    asked after every step; once it says so, the run checkpoints that step and raises
    ``Interrupted``. glibc's malloc is set to keep freed buffers, as the binaries set it
    (``platform.fast_malloc``)."""
    platform.fast_malloc()  # from Python (a notebook): no re-exec set it
    wall_start = time.time()
    mesh = parallel.make_mesh(c.num_devices)  # ``run`` has checked the batch over it
    with checkpoint.Checkpointer(workdir, identity, descriptive=DESCRIPTIVE_FIELDS) as ckpt:
        vocab_path = os.path.join(workdir, tc.VOCAB_FILE)  # for classify_infer
        ckpt.keep_data_file(vocab_path, tc.Vocab.load, data.vocab.save, data.vocab,
                            f"{workdir} holds a run trained on another vocabulary (its "
                            f"{tc.VOCAB_FILE} differs from this data's); use a new --workdir "
                            "or the run's original data")
        model = make_model(c, len(data.vocab.words), num_classes)
        params = init_params(model, jax.random.key(c.seed))
        if data.embeddings is not None:
            params = {**params, "embed": {"embedding": jnp.asarray(data.embeddings)}}
        tx = make_optimizer(c, params)
        state = parallel.put({"params": params, "opt_state": tx.init(params)},
                             parallel.replicated(mesh))
        state, progress = ckpt.resume(state, Progress())
        if progress.stopping_best_dev is None:
            progress.stopping_best_dev = progress.best_dev
        if not ckpt.best_readable(state["params"]) or not ckpt.has_best():
            # none left that the progress record could name (set aside as unreadable, gone
            # with the damaged latest checkpoint that saved it): chosen anew
            progress.best_dev, progress.best_dev_epoch, progress.test_at_best_dev = -1.0, 0, 0.0
        steps_per_epoch = -(-len(data.ids["train"]) // c.batch_size)
        checkpoint.check_steps_per_epoch(workdir, progress, steps_per_epoch)
        ckpt.keep_data_digests(checkpoint.data_digests(
            {k: [*data.ids[k], data.labels[k]] for k in data.ids}),
            "pass the run's data (its --data_dir or --hf_dataset) or use a new --workdir")
        progress.done = checkpoint.early_stopped(progress.bad_epochs, c.early_stopping_patience)
        finished = checkpoint.finished_because(progress.done, progress.epoch, c.max_epochs)
        if ckpt.latest_step() is not None:
            log(checkpoint.resume_line(workdir, progress.global_step, progress.epoch,
                                       f"step {progress.step_in_epoch}", finished))
        n_total = metrics.count_params(state["params"])
        n_embed = metrics.count_params(state["params"]["embed"])
        train_step, eval_step = make_steps(model, tx, c, mesh)
        writer = metrics.MetricsWriter(workdir, progress.global_step)
        wall_before = progress.wall_seconds
        live = sys.stdout.isatty()  # a live step counter on terminals only
        log(f"{title}: {n_total - n_embed:,} parameters + {n_embed:,} embedding, "
            f"{steps_per_epoch} steps/epoch, device {metrics.device_description(mesh.size)}, data "
            f"parallel over {mesh.size}, {c.compute_dtype} compute{native.note(c.compute_dtype)}")

        n_train = len(data.ids["train"])

        def save() -> None:
            progress.wall_seconds = wall_before + time.time() - wall_start
            ckpt.save_progress(state, progress, c.to_dict())

        def check_finite(ce_sum: float) -> None:
            if not math.isfinite(ce_sum):
                raise metrics.not_finite_error(ce_sum / n_train, f"in epoch {progress.epoch + 1}",
                                               workdir, ckpt.latest_step(), RESUMABLE_FIELDS)

        def dev_and_test() -> tuple[float, float]:
            dev, test = (accuracy(eval_step, state["params"], data.ids[k], data.labels[k],
                                  c.batch_size, mesh) for k in ("dev", "test"))
            return dev, test

        def record_best(dev: float, test: float) -> None:
            progress.best_dev, progress.best_dev_epoch = dev, progress.epoch
            progress.test_at_best_dev = test
            ckpt.save_best(progress.global_step, state["params"], {"dev_accuracy": dev})

        pace = parallel.Pacer(mesh)
        while not progress.done and progress.epoch < c.max_epochs:
            rng = np.random.default_rng([c.seed, progress.epoch])
            ce_sum = jnp.asarray(progress.epoch_ce_sum, jnp.float32)
            correct = jnp.asarray(progress.epoch_correct, jnp.float32)
            t0 = time.time()
            todo = itertools.islice(tc.batches(data.ids["train"], data.labels["train"],
                                               c.batch_size, rng), progress.step_in_epoch, None)
            for batch in todo:
                state["params"], state["opt_state"], ce, ok = train_step(
                    state["params"], state["opt_state"],
                    parallel.put(batch, parallel.batch_sharded(mesh)), progress.global_step)
                ce_sum, correct = ce_sum + pace(ce), correct + ok
                progress.global_step += 1
                progress.step_in_epoch += 1
                i = progress.step_in_epoch
                if live and (i % 10 == 0 or i == steps_per_epoch):
                    print(f"\r{title} epoch {progress.epoch + 1}/{c.max_epochs} step "
                          f"{i}/{steps_per_epoch} {time.time() - t0:.0f}s", end="", flush=True)
                interrupt = should_stop()
                if i < steps_per_epoch and (interrupt or c.checkpoint_every_steps and
                                            progress.global_step % c.checkpoint_every_steps == 0):
                    progress.epoch_ce_sum, progress.epoch_correct = float(ce_sum), float(correct)
                    check_finite(progress.epoch_ce_sum)
                    save()
                    if interrupt:
                        raise Interrupted(progress.global_step)
            if live:
                print("\r", end="")
            check_finite(float(ce_sum))
            loss = float(ce_sum) / n_train
            progress.epoch += 1
            progress.step_in_epoch, progress.epoch_ce_sum, progress.epoch_correct = 0, 0.0, 0.0
            dev, test = dev_and_test()
            if dev > progress.best_dev:
                record_best(dev, test)
            if dev > progress.stopping_best_dev:
                progress.stopping_best_dev, progress.bad_epochs = dev, 0
            else:
                progress.bad_epochs += 1
            if test > progress.best_test:
                progress.best_test, progress.best_test_epoch = test, progress.epoch
            progress.done = checkpoint.early_stopped(progress.bad_epochs,
                                                     c.early_stopping_patience)
            writer.write({"step": progress.global_step, "epoch": progress.epoch, "train_loss": loss,
                          "train_accuracy": float(correct) / n_train, "dev_accuracy": dev,
                          "test_accuracy": test, "epoch_seconds": time.time() - t0})
            log(f"{title} epoch {progress.epoch}: loss {loss:.4f} train acc "
                f"{float(correct) / n_train:.4f} dev acc {dev:.4f} test acc {test:.4f} "
                f"({time.time() - t0:.0f}s)" + (" early stop" if progress.done else ""))
            save()
            if not progress.done and progress.epoch < c.max_epochs and should_stop():
                raise Interrupted(progress.global_step)  # asked at an epoch's end
        if progress.global_step and not ckpt.has_best():
            # a finished run whose best checkpoints were unreadable (set aside above)
            record_best(*dev_and_test())
            save()  # the progress record that names them
            log(f"{title}: no best checkpoint is left: the latest parameters stand for the best")
        ckpt.wait()
        metrics.plot_curves(writer.records, ["train_accuracy", "dev_accuracy", "test_accuracy"],
                            os.path.join(workdir, "curves.png"), title)
        writer.close()
    return {
        "dev_accuracy": progress.best_dev, "best_dev_epoch": progress.best_dev_epoch,
        "test_accuracy_at_best_dev": progress.test_at_best_dev,
        "best_test_accuracy": progress.best_test, "best_test_epoch": progress.best_test_epoch,
        "epochs": progress.epoch, "steps": progress.global_step,
        "num_params": n_total - n_embed, "num_params_embedding": n_embed,
        "vocab_size": len(data.vocab.words), "wall_seconds": wall_before + time.time() - wall_start,
        "config": checkpoint.reported_config(c.to_dict(), ckpt.resumed_config, finished),
    }


def check_devices(c: ClassifierConfig) -> None:
    """Refuses ``num_devices`` and a batch they cannot split, before the workdir is made."""
    parallel.check_batch(c.batch_size, parallel.make_mesh(c.num_devices))


def check_workdir(workdir: str, identity: dict[str, Any], cv: bool) -> None:
    """Refuses a ``workdir`` holding a run of another dataset or config, whose
    ``summary.json`` this run would replace: a CV run (``cv``) refuses a single run's
    workdir (its ``run_identity.json``), and every run refuses CV folds (``fold_K/``) of
    another ``identity`` than this run's, fold numbers aside; and a learning-rate sweep's
    root (``lr_RATE/``)."""
    if not os.path.isdir(workdir):
        return
    if any(d.startswith("lr_") for d in os.listdir(workdir)):
        raise UserError(f"workdir {workdir} holds a learning-rate sweep (lr_*/); use a new "
                        "--workdir, or the sweep's --lr_sweep to resume it")
    identity = json.loads(json.dumps(identity))  # as stored: tuples become lists
    ignored = ("fold", *DESCRIPTIVE_FIELDS)
    folds = sorted(d for d in os.listdir(workdir) if re.fullmatch(r"fold_\d+", d))
    for sub in ([""] if cv else []) + folds:
        stored = checkpoint.binding_identity(os.path.join(workdir, sub))
        if stored is None:
            continue
        error = checkpoint.identity_error(workdir, stored, identity, ignored,
                                          f" in {sub}/" if sub else "")
        if error:
            raise error


def run(c: ClassifierConfig, family: ModuleType, dataset: str, data_dir: str, workdir: str,
        embeddings: str | None, oov: str = "drop", select: str = "dev",
        folds: list[int] | None = None, log: Callable[[str], None] = print,
        max_len: int = 0, hf_dataset: str | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        check_sizes: bool = True, keep: str = "first", command: str | None = None
        ) -> dict[str, Any]:
    """Trains ``c`` on ``dataset`` (every requested CV fold) and writes ``summary.json``,
    with ``command`` (the binary's command line, ``cli.command_line``) where given.
    ``max_len > 0`` keeps only the first (``keep="last"``: last) ``max_len`` tokens of
    every text; ``hf_dataset`` reads the dataset from the Hugging Face hub (or a local
    dataset directory) instead of ``data_dir``; ``should_stop`` is ``train_split``'s. Local
    splits of other sizes than the standard ones are warned about when the run starts (an
    empty or new ``workdir``), unless ``check_sizes`` is False (a deliberate excerpt)."""
    wall_start = time.time()
    starts = not os.path.isdir(workdir) or not set(os.listdir(workdir)) - {files.LOCK_FILE}
    if select not in SELECTIONS:
        raise UserError(f"unknown --select={select!r}; use dev or test")
    spec = tc.get_dataset(dataset)
    if hf_dataset and not spec.hub:
        raise UserError(f"--dataset={dataset} has no hub version (it is derived from the "
                        "local files); drop --hf_dataset and pass --data_dir")
    if not hf_dataset and not os.path.isdir(data_dir):
        raise UserError(f"data directory {data_dir} not found; pass --data_dir=DIR holding "
                        f"{tc.DATA_DIRS}")
    if max_len < 0:
        raise UserError(f"--max_len={max_len}: give a positive token count, or 0 for no limit")
    if keep not in tc.KEEP:
        raise UserError(f"--keep={keep}: use first or last")
    if folds is not None and not spec.num_folds:
        cv = ", ".join(n for n, d in tc.DATASETS.items() if d.num_folds)
        raise UserError(f"--folds applies to the cross-validated datasets ({cv}); {dataset} "
                        "has a test split, so drop --folds")
    fold_ids = folds if folds is not None else list(range(spec.num_folds or 1))
    if not fold_ids:
        raise UserError("--folds=: give fold numbers like 0,1,2")
    bad = [f for f in fold_ids if not 0 <= f < max(spec.num_folds, 1)]
    if bad:
        raise UserError(f"--folds {bad} out of range: {dataset} has "
                        f"{max(spec.num_folds, 1)} fold(s)")
    if hf_dataset:
        raw = tc.load_hub(hf_dataset, spec)
    else:
        raw = spec.load(data_dir)
        if check_sizes and starts:
            for line in tc.size_warnings(dataset, spec, raw):
                log(line)
    if starts:
        for line in tc.class_warnings(dataset, spec, raw):
            log(line)
    if max_len:
        raw = tc.truncate(raw, max_len, keep)
    vectors = None
    if embeddings:
        dim, vectors = load_glove(embeddings, tc.all_words(raw))
        if not vectors:
            raise UserError(f"no word of {dataset} has a vector in {embeddings}; "
                            "is it a lower-cased GloVe file?")
        if dim != c.embed_size:
            log(f"embed_size {c.embed_size} -> {dim} (the dimension of {embeddings})")
            c = dataclasses.replace(c, embed_size=dim)
    identity = {k: v for k, v in c.to_dict().items() if k not in RESUMABLE_FIELDS}
    identity |= {"dataset": dataset, "embeddings": os.path.basename(embeddings or ""),
                 "oov": oov} | ({"max_len": max_len} if max_len else {}) | (
                 {"keep": keep} if max_len and keep != "first" else {}) | (
                     {"hf_dataset": hf_dataset} if hf_dataset else {})
    check_devices(c)
    check_workdir(workdir, identity, cv=bool(spec.num_folds))
    # held until the summary is written (a CV run's folds each lock their fold_K/ too)
    with checkpoint.locked(workdir):
        records = {}
        for fold in fold_ids:
            splits = tc.make_splits(spec, raw, fold)
            data = encode(splits, vectors, oov, c.seed)
            sub = os.path.join(workdir, f"fold_{fold}") if spec.num_folds else workdir
            title = f"{c.name} {dataset}" + (f" fold {fold}" if spec.num_folds else "")
            records[fold] = train_split(c, data, spec.num_classes, sub, identity | {"fold": fold},
                                        log, title, should_stop)
        key = "test_accuracy_at_best_dev" if select == "dev" else "best_test_accuracy"
        if select == "dev":  # the paper's protocol appears only when asked for
            records = {f: {k: v for k, v in r.items() if not k.startswith("best_test")}
                       for f, r in records.items()}
        # the config of the record: each split's as it trained, where the splits agree
        configs = [r.pop("config") for r in records.values()]
        tests = [r[key] for r in records.values()]
        devs = [r["dev_accuracy"] for r in records.values()]
        first = next(iter(records.values()))
        summary = {
            "config": configs[0] if all(x == configs[0] for x in configs) else c.to_dict(),
            "dataset": dataset, "hf_dataset": hf_dataset,
            "embeddings": embeddings, "oov": oov,
            "max_len": max_len or None, "keep": keep if max_len else None,
            "selection": SELECTIONS[select],
            "num_params_paper": int(family.paper_param_count(c)),
            "num_params": first["num_params"],
            "num_params_embedding": first["num_params_embedding"],
            "dev_accuracy": float(np.mean(devs)), "test_accuracy": float(np.mean(tests)),
            "device": metrics.device_description(c.num_devices), "versions": metrics.versions(),
            "wall_seconds": sum(r["wall_seconds"] for r in records.values()),
            "session_wall_seconds": time.time() - wall_start, "paper": c.paper,
        }
        if command is not None:
            summary["command"] = command
        if spec.num_folds:
            summary |= {"folds": {str(f): r for f, r in records.items()},
                        "fold_test_accuracies": tests,
                        # the sample standard deviation, as the reports' "±"; none for one fold
                        "test_accuracy_std": (float(np.std(tests, ddof=1)) if len(tests) > 1
                                              else None),
                        "num_folds_run": len(tests), "num_folds": spec.num_folds}
        else:
            summary |= first
            summary["test_accuracy"] = tests[0]
        metrics.write_json(os.path.join(workdir, "summary.json"), summary)
        log(f"{c.name} {dataset}: test accuracy {summary['test_accuracy']:.4f} "
            f"({SELECTIONS[select]}), dev accuracy {summary['dev_accuracy']:.4f}")
        return summary


def run_lr_sweep(c: ClassifierConfig, rates: list[float], workdir: str,
                 log: Callable[[str], None] = print, **kwargs: Any) -> dict[str, Any]:
    """``run`` once per learning rate (in ``WORKDIR/lr_RATE``); the rate with the best dev
    accuracy is chosen (Zhao et al.: Adam lr from {1e-2, 1e-3, 1e-4} via validation) and its
    summary, with every rate's dev/test accuracy, is written to ``WORKDIR/summary.json``."""
    if not rates or any(not r > 0 for r in rates):
        raise UserError(f"--lr_sweep={rates}: give positive learning rates like 1e-2,1e-3")
    if os.path.isdir(workdir) and (checkpoint.binding_identity(workdir) is not None or any(
            d.startswith("fold_") for d in os.listdir(workdir))):
        raise UserError(f"workdir {workdir} holds a run without --lr_sweep; use a new "
                        "--workdir for the sweep")
    check_devices(c)
    runs, warned = {}, set()

    def log_once(line: str) -> None:  # a warning about the data: once, not once per rate
        if not (line.startswith("warning: ") and line in warned):
            warned.add(line)
            log(line)

    with checkpoint.locked(workdir):  # each rate's run also locks its own lr_RATE/
        for lr in rates:
            sub = os.path.join(workdir, f"lr_{lr:g}")
            runs[lr] = run(dataclasses.replace(c, learning_rate=lr), workdir=sub,
                           log=log_once, **kwargs)
        best = max(rates, key=lambda r: runs[r]["dev_accuracy"])
        summary = runs[best] | {
            "learning_rate_chosen": best, "chosen_on": "dev accuracy",
            "lr_sweep": {f"{r:g}": {k: runs[r][k] for k in ("dev_accuracy", "test_accuracy",
                                                             "wall_seconds")} for r in rates},
            "wall_seconds": sum(r["wall_seconds"] for r in runs.values()),
        }
        metrics.write_json(os.path.join(workdir, "summary.json"), summary)
    log(f"{c.name}: learning rate {best:g} chosen on dev ({runs[best]['dev_accuracy']:.4f}); "
        f"test accuracy {runs[best]['test_accuracy']:.4f}")
    return summary
