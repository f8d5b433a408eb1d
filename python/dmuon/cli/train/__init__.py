"""`python -m dmuon train`: a small byte-level GPT trained with dmuon and with AdamW.

Public pieces (the distributed job extends these):
  TrainConfig                         config.py  keyword-only, validated settings
  load_corpus(val_fraction)           data.py    bytes of pydoc_data.topics, train/val split
  unigram_entropy(data)               data.py    entropy of the byte histogram, in nats
  build_model(config)                 model.py   the GPT (lm_head and embeddings by name)
  build_optimizer(name, model, cfg)   optim.py   "dmuon" | "adamw" (| "torch-muon")
  run_training(config, name, corpus)  loop.py    one run -> RunResult
  format_table / write_json / plot_losses   report.py
"""

from dmuon.cli.train.config import OPTIMIZER_NAMES, TrainConfig
from dmuon.cli.train.data import Corpus, load_corpus, unigram_entropy
from dmuon.cli.train.loop import RunResult, run_training
from dmuon.cli.train.model import GPT, build_model
from dmuon.cli.train.optim import build_optimizer, build_scheduler

__all__ = [
    "OPTIMIZER_NAMES",
    "Corpus",
    "GPT",
    "RunResult",
    "TrainConfig",
    "build_model",
    "build_optimizer",
    "build_scheduler",
    "load_corpus",
    "run_training",
    "unigram_entropy",
]
