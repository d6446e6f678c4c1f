"""Every PTB config: parameter count pinned to the hand count, values pinned to the papers.

Hand counts (V = 10,000; LSTM layer with input d, hidden n: 4n(d+n) weights + 4n biases;
softmax: s*V + V; embedding: V*e):

zaremba_small(_dropout) / godin_stacked_200x2: 2,000,000 + 2*320,800 + 2,010,000         = 4,651,600
godin_stacked_200x3:                 4,651,600 + 320,800                       = 4,972,400
godin_stacked_350x2: 3,500,000 + 2*(980,000+1,400) + 3,510,000                 = 8,972,800
zaremba_medium:      6,500,000 + 2*(3,380,000+2,600) + 6,510,000               = 19,775,200
zaremba_large:       15,000,000 + 2*(18,000,000+6,000) + 15,010,000            = 66,022,000
godin_dense_200x2:   2,000,000 + 320,800 + 480,800 + 6,010,000                 = 8,811,600
godin_dense_200x3:   8,811,600 + 640,800 + 2,000,000                           = 11,452,400
godin_dense_200x4:   11,452,400 + 800,800 + 2,000,000                          = 14,253,200
godin_dense_200x5:   14,253,200 + 960,800 + 2,000,000                          = 17,214,000
godin_dense_650x2:   2,000,000 + 2,212,600 + 3,902,600 + 15,010,000            = 23,125,200
"""

import pytest

from dense_rnn.configs.ptb import CONFIGS
from dense_rnn.train.lm import num_params

HAND_COUNTS = {
    "zaremba_small": (4_651_600, "5M"),
    "zaremba_small_dropout": (4_651_600, "5M"),
    "zaremba_medium": (19_775_200, "20M"),
    "zaremba_large": (66_022_000, "66M"),
    "godin_stacked_200x2": (4_651_600, "5M"),
    "godin_stacked_200x3": (4_972_400, "5M"),
    "godin_stacked_350x2": (8_972_800, "9M"),
    "godin_dense_200x2": (8_811_600, "9M"),
    "godin_dense_200x3": (11_452_400, "11M"),
    "godin_dense_200x4": (14_253_200, "14M"),
    "godin_dense_200x5": (17_214_000, "17M"),
    "godin_dense_650x2": (23_125_200, "23M"),
    "godin_dense_650x2_vd": (23_125_200, "23M"),
}


def test_every_paper_row_has_a_config():
    assert set(HAND_COUNTS) | {"tiny"} == set(CONFIGS)


@pytest.mark.parametrize("name", sorted(HAND_COUNTS))
def test_param_count(name):
    count, table = HAND_COUNTS[name]
    assert num_params(CONFIGS[name]) == count
    assert f"{round(count / 1e6)}M" == table == CONFIGS[name].paper_params


# name: hidden, layers, embed, connectivity, dropout, variational, init, num_steps,
#       decay, decay_after, clip, epochs
PINNED = {
    "zaremba_small": (200, 2, 200, "stacked", 0.0, False, 0.1, 20, 0.5, 4, 5.0, 13),
    "zaremba_small_dropout": (200, 2, 200, "stacked", 0.5, False, 0.05, 35, 1 / 1.2, 6, 5.0, 39),
    "zaremba_medium": (650, 2, 650, "stacked", 0.5, False, 0.05, 35, 1 / 1.2, 6, 5.0, 39),
    "zaremba_large": (1500, 2, 1500, "stacked", 0.65, False, 0.04, 35, 1 / 1.15, 14, 10.0, 55),
    "godin_stacked_200x2": (200, 2, 200, "stacked", 0.6, False, 0.05, 35, 0.95, 6, 3.0, 100),
    "godin_stacked_200x3": (200, 3, 200, "stacked", 0.6, False, 0.05, 35, 0.95, 6, 3.0, 100),
    "godin_stacked_350x2": (350, 2, 350, "stacked", 0.6, False, 0.05, 35, 0.95, 6, 3.0, 100),
    "godin_dense_200x2": (200, 2, 200, "dense", 0.6, False, 0.05, 35, 0.95, 6, 3.0, 100),
    "godin_dense_200x3": (200, 3, 200, "dense", 0.6, False, 0.05, 35, 0.95, 6, 3.0, 100),
    "godin_dense_200x4": (200, 4, 200, "dense", 0.6, False, 0.05, 35, 0.95, 6, 3.0, 100),
    "godin_dense_200x5": (200, 5, 200, "dense", 0.6, False, 0.05, 35, 0.95, 6, 3.0, 100),
    "godin_dense_650x2": (650, 2, 200, "dense", 0.75, False, 0.05, 35, 0.95, 6, 3.0, 100),
    "godin_dense_650x2_vd": (650, 2, 200, "dense", 0.5, True, 0.05, 35, 0.95, 6, 3.0, 100),
}


# name: (valid ppl, test ppl) as printed. Zaremba et al. 2014 Table 1 (small: the
# non-regularized LSTM); Godin et al. 2017 Table 1 (zaremba_small_dropout: its row 1,
# their own run; medium and large: its rows 2-3, quoting Zaremba et al.).
PAPER_PPL = {
    "zaremba_small": (120.7, 114.5),
    "zaremba_small_dropout": (104.5, 100.4),
    "zaremba_medium": (86.2, 82.7),
    "zaremba_large": (82.2, 78.4),
    "godin_stacked_200x2": (105.0, 100.9),
    "godin_stacked_200x3": (113.0, 108.8),
    "godin_stacked_350x2": (91.5, 87.9),
    "godin_dense_200x2": (83.4, 80.4),
    "godin_dense_200x3": (81.5, 78.5),
    "godin_dense_200x4": (79.2, 76.8),
    "godin_dense_200x5": (79.7, 76.9),
    "godin_dense_650x2": (81.5, 78.9),
    "godin_dense_650x2_vd": (81.3, 78.3),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_config_values(name):
    c = CONFIGS[name]
    got = (c.hidden_size, c.num_layers, c.embed_size, c.connectivity, c.dropout_rate,
           c.variational, c.init_scale, c.num_steps, c.lr_decay, c.decay_after_epochs,
           c.max_grad_norm, c.max_epochs)
    assert got == PINNED[name]
    assert (c.paper_valid_ppl, c.paper_test_ppl) == PAPER_PPL[name]
    assert (c.batch_size, c.learning_rate, c.vocab_size) == (20, 1.0, 10_000)
    assert c.early_stopping_patience == (0 if name.startswith("zaremba") else 10)


@pytest.mark.parametrize("field,value", [
    ("batch_size", 0), ("connectivity", "foo"), ("dropout_rate", 1.5), ("num_layers", 0),
    ("log_every_steps", 0), ("learning_rate", -1.0), ("learning_rate", float("nan")),
    ("lr_decay", 0.0), ("init_scale", 0.0), ("max_grad_norm", 0.0), ("max_grad_norm", -5.0),
    ("max_steps", -1), ("early_stopping_patience", -1), ("checkpoint_every_steps", -1),
    ("decay_after_epochs", -1), ("seed", -1), ("num_devices", -1),
])
def test_bad_values_are_refused_in_one_line(field, value):
    import dataclasses

    from dense_rnn.errors import UserError

    with pytest.raises(UserError, match=f"^config tiny: {field}=[^;]*$"):
        dataclasses.replace(CONFIGS["tiny"], **{field: value})


# The learning rate of each epoch (0-based) as the papers give it: Zaremba et al.'s medium
# model "Learning rate = 1 which decays by a factor of 1.2 after 6 epochs", the large one "by
# a factor of 1.15 after 14 epochs" (../shared/papers/zaremba2014_rnn_regularization_notes.txt), the
# small one 0.5 after 4 (their code's SmallConfig: max_epoch 4, lr_decay 0.5); Godin et al.
# "training for six epochs with a learning rate of one and then applying a decay factor of
# 0.95 every epoch" (zaremba_small_dropout: "Zaremba's medium setup", their footnote).
LR_BY_EPOCH = {
    "zaremba_small": [1.0] * 4 + [0.5, 0.25, 0.125],
    "zaremba_medium": [1.0] * 6 + [1 / 1.2, 1 / 1.2**2],
    "zaremba_large": [1.0] * 14 + [1 / 1.15, 1 / 1.15**2],
    "zaremba_small_dropout": [1.0] * 6 + [1 / 1.2, 1 / 1.2**2],
    "godin_dense_200x4": [1.0] * 6 + [0.95, 0.95**2],
}


@pytest.mark.parametrize("name", sorted(LR_BY_EPOCH))
def test_learning_rate_schedule_is_the_papers(name):
    """The schedule by step, and the optimizer's update (one step of SGD on the loss
    ``w``, gradient 1) at the first and last step of every epoch."""
    import jax.numpy as jnp
    import numpy as np

    from dense_rnn.train.lm import learning_rate_schedule, make_optimizer

    c, steps = CONFIGS[name], 10
    schedule = learning_rate_schedule(c, steps)
    for epoch, lr in enumerate(LR_BY_EPOCH[name]):
        for step in (epoch * steps, epoch * steps + steps - 1):
            np.testing.assert_allclose(float(schedule(step)), lr, rtol=1e-6)
    tx = make_optimizer(c, steps)
    state = tx.init(jnp.zeros(()))
    lrs = []
    for _ in range(len(LR_BY_EPOCH[name]) * steps):
        update, state = tx.update(jnp.ones(()), state)
        lrs.append(-float(update))
    np.testing.assert_allclose(lrs[::steps], LR_BY_EPOCH[name], rtol=1e-6)
    np.testing.assert_allclose(lrs[steps - 1::steps], LR_BY_EPOCH[name], rtol=1e-6)
