"""The process group, the model and the data of the LLM training program (:mod:`semimig.bench.llm`)."""
from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Iterator, Optional, Tuple

import torch

if TYPE_CHECKING:
    from semimig.bench.corpus import ByteCorpus

logger = logging.getLogger(__name__)

VOCAB_MULTIPLE = 64
"""Colossal-AI's ``make_vocab_size_divisible_by`` default: every TP rank's vocabulary shard is a multiple of it."""

SYNTHETIC_VOCAB = 512
"""The synthetic data's vocabulary: token sequences ``x_t = (a + b·t) mod 512``."""


def init_distributed(prog: str, timeout_s: float) -> tuple[int, int, torch.device]:
    """The process group torchrun (or colossalai run) describes in the environment, with a bounded timeout;
    this rank, the world size and the device.  ``prog`` (the script's name) starts the messages."""
    import torch.distributed as dist

    from semimig.launch import set_collective_timeout

    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        sys.exit(f"{prog}: start it with torchrun or colossalai run (RANK/WORLD_SIZE are not set), e.g.\n"
                 f"  torchrun --nproc_per_node 2 {prog}")
    watch_launcher(prog, int(os.environ["RANK"]))
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    set_collective_timeout(timeout_s)  # also the groups HybridParallelPlugin creates later
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def watch_launcher(prog: str, rank: int, poll_s: float = 0.5) -> None:
    """End this rank within ``poll_s`` once its launcher (the parent: torchrun's agent) has died.

    torchrun ends the other ranks when one dies, but nothing ends the ranks of a launcher that was
    killed (``kill -9``, a lost terminal): they would train on unseen.  A daemon thread watches the
    parent pid and exits the process (status 1) naming the launcher that died."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        try:
            logger.error("%s: error: rank %d: its launcher (pid %d) died; stopping", prog, rank, parent)
        finally:
            os._exit(1)

    threading.Thread(target=watch, name="watch-launcher", daemon=True).start()


def model_config(args: argparse.Namespace, tp: int = 1):
    """The model's config alone (no weights): the tiny Llama's from the flags (its vocabulary padded for ``tp``
    ranks), or ``--model``'s from disk."""
    import transformers as T

    if args.model != "tiny-llama":
        return T.AutoConfig.from_pretrained(args.model, local_files_only=True)
    vocab = 256 if args.data == "shakespeare" else SYNTHETIC_VOCAB  # bytes, or the synthetic range
    # Colossal-AI pads the vocabulary to a multiple of 64·tp and its cross entropy fails on a rank whose
    # shard is padding only; ids above the data's range are never fed and only learn to be unlikely
    vocab = max(vocab, VOCAB_MULTIPLE * tp)
    return T.LlamaConfig(vocab_size=vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=max(256, args.seq_len))


def build_model(args: argparse.Namespace, tp: int = 1) -> torch.nn.Module:
    """The tiny Llama (seeded; its vocabulary padded for ``tp`` ranks), or ``--model`` read from disk."""
    import transformers as T

    torch.manual_seed(args.seed)
    if args.model == "tiny-llama":
        model = T.LlamaForCausalLM(model_config(args, tp))
    else:
        model = T.AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True)
        if args.data == "shakespeare" and model.config.vocab_size < 256:
            from semimig.errors import ConfigError

            raise ConfigError(f"--data shakespeare feeds bytes as token ids 0..255: --model {args.model} has "
                              f"only {model.config.vocab_size} tokens")
    model.config.use_cache = False  # training: no KV cache (Colossal-AI warns about it otherwise)
    return model


def synthetic_batches(vocab: int, batch: int, seq: int, seed: int, device: torch.device) -> Iterator[dict]:
    """Endless batches of ``x_t = (a + b·t) mod vocab`` (labels = inputs; the model shifts them)."""
    gen = torch.Generator().manual_seed(seed)
    steps = torch.arange(seq)
    while True:
        start = torch.randint(0, vocab, (batch, 1), generator=gen)
        stride = torch.randint(1, 8, (batch, 1), generator=gen)
        ids = (start + stride * steps) % vocab
        yield {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device),
               "labels": ids.to(device)}


def make_data(args: argparse.Namespace, vocab: int, dp_rank: int, device: torch.device, *, prog: str,
              eval_batches: int, dp_size: int = 1,
              global_batch: bool = False) -> Tuple[Iterator[dict], list, Optional["ByteCorpus"]]:
    """Training batches, the fixed validation batches (the same on every rank) and the corpus
    (``None`` for synthetic data; ``args``: ``data``, ``batch_size``, ``seq_len``, ``seed``).  DP rank ``d``
    trains on stream ``d``; with ``global_batch`` (``--batch-split``)
    every rank gets the global batch instead, streams ``0..dp_size-1`` concatenated row-wise (so the
    even split gives each group the rows it trains on without a split)."""
    def as_batch(ids: torch.Tensor) -> dict:
        ids = ids.to(device)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

    def stream(d: int) -> Iterator[dict]:
        if args.data == "synthetic":
            return synthetic_batches(vocab, args.batch_size, args.seq_len, args.seed * 1000 + d, device)
        return (as_batch(ids) for ids in corpus.train_batches(args.batch_size, args.seq_len, args.seed * 1000 + d))

    def global_batches() -> Iterator[dict]:
        for parts in zip(*(stream(d) for d in range(dp_size))):
            yield {key: torch.cat([p[key] for p in parts]) for key in parts[0]}

    corpus = None
    if args.data == "synthetic":
        val_stream = synthetic_batches(vocab, args.batch_size, args.seq_len, 2**31 - 1 - args.seed, device)
        val = [next(val_stream) for _ in range(eval_batches)]
    else:
        from semimig.bench.corpus import load_corpus
        from semimig.errors import ConfigError

        try:
            corpus = load_corpus()
        except ConfigError as err:
            sys.exit(f"{prog}: {err}")
        val = [as_batch(ids) for ids in corpus.val_batches(args.batch_size, args.seq_len, eval_batches)]
    return (global_batches() if global_batch else stream(dp_rank)), val, corpus


def evaluate(model: torch.nn.Module, batches: list, *, rows: Optional[range] = None, dp_group: Any = None) -> float:
    """Mean loss (nats a token) over ``batches``: eval mode (semimig's layers then run densely and
    untimed), no gradients.  Collective: every rank of the TP group must call it with the same batches.

    With ``rows`` (this data-parallel group's rows of every batch,
    :func:`~semimig.allocation.evaluation_share` of a batch's rows) the group evaluates those rows of
    each batch: one forward per batch on every group, so a forward that is itself a collective over the
    data-parallel group (torch DDP broadcasts its buffers in each one) stays matched, and a group with no
    rows runs a one-row stand-in weighted 0.  Each forward's loss times its rows, and the rows, are
    summed over ``dp_group``: the mean over every batch, each row evaluated once, for batches of equal
    rows that each predict the same number of tokens (fixed-length rows, as these batches are)."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            if rows is None:
                total, count = total + float(model(**batch).loss.float()), count + 1
                continue
            a, b = (rows.start, rows.stop) if len(rows) else (0, 1)  # no rows: a stand-in row, weighted 0
            loss = float(model(**{k: v[a:b] for k, v in batch.items()}).loss.float())
            total, count = total + loss * len(rows), count + len(rows)
    model.train()
    if rows is None:
        return total / count
    from semimig.comm.primitives import collective_device

    both = torch.tensor([total, float(count)], dtype=torch.float64, device=collective_device(dp_group))
    torch.distributed.all_reduce(both, group=dp_group)
    return float(both[0] / both[1])

