"""Named DC-Bi-LSTM configs (Ding et al. 2018): Table 1 model, every row of Tables 3-5, baseline.

Names: ``dc_bilstm`` (Table 1: dl=15, dh=13, th=100), ``bilstm`` (the Bi-LSTM baseline,
dl=0, th=300 = Table 3 row 1) and ``dc_bilstm_t{table}_dl{dl}_dh{dh}`` for each table row.
Every config's ``paper`` field gives the row and its reported accuracies.

Parameter counts (``paper_param_count``) follow the paper: LSTM weight matrices only, no
biases, no embedding, no softmax. A Bi-LSTM layer of ``d`` units reading ``n`` features has
``2 * 4 * d * (n + d)`` weights; dense layer ``l`` reads ``m + 2 * dh * (l - 1)`` features
and the top layer ``m + 2 * dh * dl`` (eq. 13), ``m`` the embedding size. With ``m = 300``
this reproduces every Params entry of Tables 3-5 (e.g. ``dc_bilstm``: 0.772M + 0.632M =
1,404,200 -> "1.40M"); counting the biases too would give 1,406,560 -> "1.41M".
"""

from __future__ import annotations

from dense_rnn.configs.classifier import ClassifierConfig

DROPOUT_EMBED = 0.3  # the paper does not give its dropout rates
DROPOUT_POOL = 0.5
# nor its L2 weight: "L2 constraints over the soft-max parameters" read as a penalty (Kim
# 2014's "l2-norm constraint", a max-norm rescale of the weight vectors, is the other reading)
L2 = 1e-3


def dense_features(dl: int, dh: int, th: int) -> tuple[int, ...]:
    """Hidden sizes of the dense module followed by the top Bi-LSTM; ``dh=0`` means no module."""
    return (dh,) * (dl if dh else 0) + (th,)


def lstm_weight_count(embed_size: int, dl: int, dh: int, th: int) -> int:
    """Paper-style count: bidirectional LSTM weights ``w_ih`` and ``w_hh`` of every layer."""
    total, inp = 0, embed_size
    for d in dense_features(dl, dh, th):
        total += 2 * 4 * d * (inp + d)
        inp += 2 * d
    return total


def _features(config: ClassifierConfig) -> tuple[int, ...]:
    """``dense_features`` of a DC-Bi-LSTM config: the model it builds."""
    return dense_features(*(config.model_args[k] for k in ("dl", "dh", "th")))


def paper_param_count(config: ClassifierConfig) -> int:
    """``lstm_weight_count`` of a DC-Bi-LSTM config."""
    a = config.model_args
    return lstm_weight_count(config.embed_size, a["dl"], a["dh"], a["th"])


def _config(name: str, dl: int, dh: int, th: int, paper: str) -> ClassifierConfig:
    return ClassifierConfig(
        name=name,
        model="dc_bilstm",
        model_args={"dl": dl, "dh": dh, "th": th, "dropout_embed": DROPOUT_EMBED,
                    "dropout_pool": DROPOUT_POOL},
        l2=L2,
        paper=paper,
    )


# (table, dl, dh, th, params, SST-1, SST-2) as printed in Ding et al. 2018.
TABLE_ROWS = (
    (3, 0, 10, 300, "1.44M", 49.2, 87.2),
    (3, 5, 40, 100, "1.44M", 49.6, 88.4),
    (3, 10, 20, 100, "1.44M", 51.0, 88.5),
    (3, 15, 13, 100, "1.40M", 51.9, 89.7),
    (3, 20, 10, 100, "1.44M", 50.2, 88.8),
    (4, 0, 10, 100, "0.32M", 48.5, 87.5),
    (4, 5, 10, 100, "0.54M", 49.4, 88.1),
    (4, 10, 10, 100, "0.80M", 49.5, 88.4),
    (4, 15, 10, 100, "1.10M", 50.6, 88.8),
    (4, 20, 10, 100, "1.44M", 50.2, 88.8),
    (5, 10, 0, 100, "0.32M", 48.5, 87.5),
    (5, 10, 5, 100, "0.54M", 49.2, 88.3),
    (5, 10, 10, 100, "0.80M", 49.5, 88.4),
    (5, 10, 15, 100, "1.10M", 50.2, 88.4),
    (5, 10, 20, 100, "1.44M", 51.0, 88.5),
)

# Table 1 accuracies (%): DC-Bi-LSTM, and the Bi-LSTM of Tai et al. (2015) it is compared with.
TABLE1 = {
    "dc_bilstm": {"mr": 82.8, "sst1": 51.9, "sst2": 89.7, "subj": 94.5, "trec": 95.6},
    "bilstm": {"mr": 81.8, "sst1": 49.1, "sst2": 87.5, "subj": 93.0, "trec": 93.6},
}


def paper_accuracy(name: str, dataset: str, table: int | None = None) -> float | None:
    """The paper's accuracy (%) of a named config on a dataset in ``table`` (1, 3, 4 or 5;
    default: Table 1 for its two models, else the config's own table), or None.

    Rows of Tables 3-5 are matched on the model they build (``dense_features``): ``bilstm``
    is Table 3's first row, whose own numbers (49.2 / 87.2) differ from the Tai et al. ones
    Table 1 quotes (49.1 / 87.5). ``sst1_phrases`` / ``sst2_phrases`` (training on every
    phrase, testing on the same sentences) have the SST-1 / SST-2 targets.
    """
    dataset = dataset.removesuffix("_phrases")
    if table is None:
        table = 1 if name in TABLE1 else next(
            (t for t, dl, dh, *_ in TABLE_ROWS if name == f"dc_bilstm_t{t}_dl{dl}_dh{dh}"), None)
    if table == 1:
        return TABLE1.get(name, {}).get(dataset)
    if name not in CONFIGS or dataset not in ("sst1", "sst2"):
        return None
    for t, dl, dh, th, _, s1, s2 in TABLE_ROWS:
        if t == table and dense_features(dl, dh, th) == _features(CONFIGS[name]):
            return s1 if dataset == "sst1" else s2
    return None


def table_configs(table: int) -> list[str]:
    """Config names of the rows of Ding et al.'s Table ``table`` (3, 4 or 5), in order.

    A row that builds the same model as a Table 1 model or an earlier row (the same
    ``dense_features``; e.g. Table 5's dl=10, dh=0 is Table 4's dl=0: no dense module) is
    named after that one, so a reproduction trains each distinct model once.
    """
    first = {_features(CONFIGS[n]): n for n in TABLE1}
    names = []
    for t, dl, dh, th, *_ in TABLE_ROWS:
        name = first.setdefault(dense_features(dl, dh, th), f"dc_bilstm_t{t}_dl{dl}_dh{dh}")
        if t == table:
            names.append(name)
    return names


CONFIGS: dict[str, ClassifierConfig] = {
    "dc_bilstm": _config(
        "dc_bilstm", 15, 13, 100,
        "Table 1 DC-Bi-LSTM (dl=15, dh=13, th=100, 1.40M): MR 82.8, SST-1 51.9, SST-2 89.7, "
        "Subj 94.5, TREC 95.6",
    ),
    "bilstm": _config(
        "bilstm", 0, 10, 300,
        "Table 3 row 1 Bi-LSTM baseline (dl=0, th=300, 1.44M): SST-1 49.2, SST-2 87.2; "
        "Table 1 Bi-LSTM [Tai et al.]: MR 81.8, SST-1 49.1, SST-2 87.5, Subj 93.0, TREC 93.6",
    ),
}
CONFIGS |= {
    f"dc_bilstm_t{t}_dl{dl}_dh{dh}": _config(
        f"dc_bilstm_t{t}_dl{dl}_dh{dh}", dl, dh, th,
        f"Table {t} (dl={dl}, dh={dh}, th={th}, {p}): SST-1 {s1}, SST-2 {s2}",
    )
    for t, dl, dh, th, p, s1, s2 in TABLE_ROWS
}
