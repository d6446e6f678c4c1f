"""Flax models. ``CLASSIFIERS`` maps the ``model`` names used by classifier configs to classes."""

from dense_rnn.models.dc_bilstm import DCBiLSTM
from dense_rnn.models.hm_densernn import HMTextClassifier
from dense_rnn.models.lm import LanguageModel

CLASSIFIERS: dict[str, type] = {"dc_bilstm": DCBiLSTM, "hm_text_classifier": HMTextClassifier}

__all__ = ["CLASSIFIERS", "DCBiLSTM", "HMTextClassifier", "LanguageModel"]
