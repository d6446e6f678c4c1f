"""Dataset readers; ``DEFAULT_DATA_DIR`` is the data root the binaries and tests default to."""

import os

# <checkout>/../shared/data: mr/, sst/, subj/, trec/, imdb/, ag_news/, ptb/, glove/
DEFAULT_DATA_DIR = os.path.normpath(
    os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data"))
