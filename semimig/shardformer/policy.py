"""``SemiMigPolicy``: any Colossal-AI ShardFormer policy, with semimig's linear layers swapped in.

    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, custom_policy=SemiMigPolicy())
    model, _ = ShardFormer(shard_config).optimize(model, policy=SemiMigPolicy())

The wrapped policy (``base``; Colossal-AI's auto policy for the model when ``None``) decides
everything as usual; only the replacement targets change, exactly by class (:data:`SWAPS`)::

    colossalai.shardformer.layer.Linear1D_Col               ->  semimig.nn.Linear1D_Col
    colossalai.shardformer.layer.Linear1D_Row               ->  semimig.nn.Linear1D_Row
    colossalai.shardformer.layer.GPT2FusedLinearConv1D_Col  ->  semimig.nn.GPT2FusedLinearConv1D_Col
    colossalai.shardformer.layer.GPT2FusedLinearConv1D_Row  ->  semimig.nn.GPT2FusedLinearConv1D_Row
    colossalai.shardformer.layer.FusedLinear1D_Col          ->  semimig.nn.FusedLinear1D_Col
    colossalai.shardformer.layer.FusedLinear1D_Row          ->  semimig.nn.FusedLinear1D_Row

A replacement whose kwargs semimig cannot serve (:func:`semimig.nn.conversion.unsupported_options`:
``ring`` sequence parallelism, fp8 communication, zero-bubble pipelines) keeps Colossal-AI's class,
and so does every other tensor-parallel linear class (for instance a custom one).  Those are
named, with the reason, in ONE warning per policy.  Output heads (``VocabParallelLMHead1D``,
``PaddingLMHead``) stay Colossal-AI's by design — the controller never balances the head — and
are only logged at INFO; ``LinearWithGradAccum``, ``GPT2FusedLinearConv`` and ``FusedLinear`` run
no tensor-parallel GEMM (Colossal-AI uses them when TP is off) and are not listed.

Uneven shards (DESIGN §8): ``SemiMigPolicy(shard_plan=UnevenPlan(mlp_units=..., kv_units=...))``
(:mod:`semimig.shardformer.uneven`) gives each rank its plan's MLP blocks and KV groups, for the
models in :data:`semimig.shardformer.uneven.SUPPORTED` (Llama, Qwen2, Mistral; GPT-2; ViT) and
refuses others in one line.  The base policy's descriptions get ``shard_sizes`` for the paired
layers (:data:`PLANNED`: ``q/o``, GPT-2's ``c_attn`` parts and ``attn.c_proj``, ViT's ``query`` and
``attention.output.dense``: KV groups in query rows; ``k/v``: KV groups in KV rows;
``gate/up/down``, ``c_fc/mlp.c_proj``, ViT's ``intermediate.dense/output.dense``: MLP blocks) and
this rank's attention sizes (:func:`~semimig.shardformer.uneven.attention_attributes`).  Embeddings
and the head stay even.  Refused with a plan: sequence parallelism other than ``split_gather``, and
any paired layer semimig cannot serve.  After sharding, the shards Colossal-AI's grad norm would
count ``1/tp`` times are marked
(:mod:`semimig.shardformer.uneven_norm`) so clipping counts each once.  Every policy installs
:mod:`semimig.shardformer.uneven_ckpt`, so ``booster.save_optimizer``/``load_optimizer`` handle
uneven shards (the model files already do) in Colossal-AI's even, full-tensor form.  ``shard_plan=None`` is
exactly the behaviour above.
"""
from __future__ import annotations

import dataclasses
import logging
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Union

import torch.distributed as dist
import torch.nn as nn
from colossalai.shardformer import layer as cai
from colossalai.shardformer.layer.parallel_module import ParallelModule
from colossalai.shardformer.policies.auto_policy import get_autopolicy
from colossalai.shardformer.policies.base_policy import ModulePolicyDescription, Policy
from colossalai.shardformer.shard import ShardConfig

import semimig.nn as snn
from semimig.errors import ConfigError
from semimig.nn.conversion import unsupported_options
from semimig.shardformer import uneven_ckpt, uneven_norm
from semimig.shardformer.uneven import ResolvedPlan, UnevenPlan, attention_attributes

logger = logging.getLogger(__name__)

SWAPS = {
    cai.Linear1D_Col: snn.Linear1D_Col,
    cai.Linear1D_Row: snn.Linear1D_Row,
    cai.GPT2FusedLinearConv1D_Col: snn.GPT2FusedLinearConv1D_Col,
    cai.GPT2FusedLinearConv1D_Row: snn.GPT2FusedLinearConv1D_Row,
    cai.FusedLinear1D_Col: snn.FusedLinear1D_Col,
    cai.FusedLinear1D_Row: snn.FusedLinear1D_Row,
}
"""Colossal-AI's tensor-parallel linear classes and the semimig class that replaces each."""

HEADS = (cai.VocabParallelLMHead1D, cai.PaddingLMHead)
"""Output heads: never balanced (the controller keeps the head dense), so left to Colossal-AI."""

NOT_TENSOR_PARALLEL = (cai.LinearWithGradAccum, cai.GPT2FusedLinearConv, cai.FusedLinear)
"""Linear classes with the full weight on every rank (TP off): nothing to balance."""

PLANNED = {
    "llama": {"self_attn.q_proj": "q", "self_attn.k_proj": "kv", "self_attn.v_proj": "kv", "self_attn.o_proj": "q",
              "mlp.gate_proj": "mlp", "mlp.up_proj": "mlp", "mlp.down_proj": "mlp"},
    "gpt2": {"attn.c_attn": "q", "attn.c_proj": "q", "mlp.c_fc": "mlp", "mlp.c_proj": "mlp"},
    # "attention.output.dense" before "output.dense": a module name is matched to the first suffix it ends with
    "vit": {"attention.attention.query": "q", "attention.attention.key": "kv", "attention.attention.value": "kv",
            "attention.output.dense": "q", "intermediate.dense": "mlp", "output.dense": "mlp"},
}
"""Per model family, the paired layers (replacement suffixes) and which plan of a
:class:`~semimig.shardformer.uneven.ResolvedPlan` gives their ``shard_sizes``; the first is the
attention's query projection, whose parent module is the attention (:func:`attention_path`)."""


def query_layer(family: str) -> str:
    """A ``family`` layer's query projection (``self_attn.q_proj``, ``attn.c_attn``,
    ``attention.attention.query``): the first entry of :data:`PLANNED`."""
    return next(iter(PLANNED[family]))


def attention_path(family: str) -> str:
    """Where a ``family`` layer's attention module sits (``self_attn``, ``attn``, ``attention.attention``):
    the parent of its query projection."""
    return query_layer(family).rsplit(".", 1)[0]


def _is_tp_linear(target: object) -> bool:
    """A tensor-parallel linear class: Colossal-AI's, a subclass, or a ParallelModule named like one
    (``...Linear...``, ``..._Col``, ``..._Row``: e.g. Colossal-AI's ``DeepseekMoEGate_Col``)."""
    if not isinstance(target, type) or issubclass(target, NOT_TENSOR_PARALLEL):
        return False
    if issubclass(target, tuple(SWAPS)) or issubclass(target, HEADS):
        return True
    name = target.__name__.lower()
    return issubclass(target, ParallelModule) and ("linear" in name or name.endswith(("_col", "_row")))


class SemiMigPolicy(Policy):
    """Wraps ``base`` (a Colossal-AI ``Policy``, or None for the model's auto policy)."""

    def __init__(self, base: Optional[Policy] = None, *, shard_plan: Optional[UnevenPlan] = None) -> None:
        super().__init__()
        if base is not None and not isinstance(base, Policy):
            raise ConfigError(f"SemiMigPolicy(base=...) expects a colossalai Policy, got {type(base).__name__}")
        if shard_plan is not None and not isinstance(shard_plan, UnevenPlan):
            raise ConfigError(f"SemiMigPolicy(shard_plan=...) expects a semimig.shardformer.UnevenPlan or None, "
                              f"got {type(shard_plan).__name__}")
        self.base = base
        self.shard_plan = shard_plan
        self.resolved: Optional[ResolvedPlan] = None  # shard_plan checked against the model (module_policy)
        self.swapped: List[str] = []
        self.unbalanced: Dict[str, str] = {}
        self._reported: Optional[tuple] = None

    # --- the Policy protocol, delegated --------------------------------------------------
    def set_model(self, model: nn.Module) -> None:
        super().set_model(model)
        if self.base is None:
            try:
                self.base = get_autopolicy(model)
            except NotImplementedError as err:
                raise ConfigError(
                    f"SemiMigPolicy: Colossal-AI has no policy for {type(model).__qualname__} "
                    f"({type(model).__module__}); pass SemiMigPolicy(base=YourPolicy())"
                ) from err
        self.base.set_model(model)

    def set_shard_config(self, shard_config: ShardConfig) -> None:
        self.shard_config = shard_config
        self._require_base().set_shard_config(shard_config)

    def config_sanity_check(self) -> None:
        self._require_base().config_sanity_check()

    def preprocess(self) -> nn.Module:
        self.model = self._require_base().preprocess()
        return self.model

    def postprocess(self) -> nn.Module:
        self.model = self._require_base().postprocess()
        uneven_ckpt.install()  # checkpoints of any plan, this one or a later re-plan's (bit-equal for the rest)
        if self.resolved is not None:
            uneven_norm.install()
            marked = uneven_norm.mark_tp_shards(self.model)
            _, rank = self._tp()
            heads, kv_heads = self.resolved.heads(rank)
            logger.info("SemiMigPolicy: %s on TP rank %d: %d MLP columns, %d query / %d KV heads "
                        "(%d shard(s) marked for the grad norm)", self.shard_plan, rank,
                        self.resolved.mlp.sizes[rank], heads, kv_heads, marked)
        return self.model

    def get_held_layers(self) -> List[nn.Module]:
        return self._require_base().get_held_layers()

    def get_shared_params(self):
        return self._require_base().get_shared_params()

    def module_policy(self) -> Dict[Union[str, nn.Module], ModulePolicyDescription]:
        """The base policy's descriptions, with each servable replacement's target swapped (see module doc)."""
        planned = self._resolve_plan()
        with self._divisible_heads(planned):
            policy = self._require_base().module_policy()
        if planned is not None:
            self._apply_plan(policy, planned)
        self.swapped, self.unbalanced, heads = [], {}, {}
        for key, description in policy.items():
            for i, replacement in enumerate(description.sub_module_replacement or []):
                target = replacement.target_module
                where = f"{getattr(key, '__name__', key)}.{replacement.suffix}"
                ours = SWAPS.get(target)
                reasons = unsupported_options(replacement.kwargs or {}) if ours is not None else []
                if ours is not None and not reasons:
                    description.sub_module_replacement[i] = dataclasses.replace(replacement, target_module=ours)
                    self.swapped.append(where)
                elif isinstance(target, type) and issubclass(target, HEADS):
                    heads[where] = target.__name__
                elif reasons:
                    self.unbalanced[where] = f"{target.__name__}: " + "; ".join(reasons)
                elif _is_tp_linear(target):
                    self.unbalanced[where] = f"{target.__name__}: a layer class semimig does not know"
        self._report(heads)
        if planned is not None:
            self._check_planned_swapped(policy)
        return policy

    # --- uneven shards (shard_plan) ------------------------------------------------------
    def _tp(self) -> tuple:
        """``(tp, rank in the TP group)``."""
        config = self.shard_config
        tp = config.tensor_parallel_size if config.enable_tensor_parallelism else 1
        group = config.tensor_parallel_process_group
        rank = dist.get_rank(group) if tp > 1 else 0
        return tp, rank

    def _resolve_plan(self) -> Optional[ResolvedPlan]:
        """``shard_plan`` checked against the model and the group; ``None`` without a plan or with TP off."""
        self.resolved = None
        if self.shard_plan is None:
            return None
        tp, _ = self._tp()
        try:
            resolved = self.shard_plan.resolve(self.model.config, tp)
        except ConfigError as err:
            raise ConfigError(f"SemiMigPolicy(shard_plan={self.shard_plan}): {err}") from None
        if tp == 1:
            return None
        config = self.shard_config
        mode = config.sequence_parallelism_mode if config.enable_sequence_parallelism else None
        if mode not in (None, "split_gather"):
            raise ConfigError(f"SemiMigPolicy(shard_plan=...): sequence_parallelism_mode={mode!r} is refused with "
                              "uneven shards (it splits heads or exchanges evenly); use 'split_gather' or none")
        self.resolved = resolved
        return resolved

    @contextmanager
    def _divisible_heads(self, planned: Optional[ResolvedPlan]) -> Iterator[None]:
        """The base policies assert ``tp`` divides the heads; under a plan the plan decides, so the
        config shows them ``tp``-divisible values while the base policy is built (all its per-rank
        values are overwritten by :meth:`_apply_plan`), and gets its own back after."""
        if planned is None:
            yield
            return
        tp, _ = self._tp()
        config, dims = self.model.config, planned.dims
        saved = {}
        if dims.num_heads % tp or dims.num_kv_heads % tp:
            saved["num_attention_heads"] = config.num_attention_heads
            config.num_attention_heads = tp * (dims.num_heads // dims.num_kv_heads)
            if dims.family == "llama" and getattr(config, "num_key_value_heads", None):
                saved["num_key_value_heads"] = config.num_key_value_heads
                config.num_key_value_heads = tp
        try:
            yield
        finally:
            for key, value in saved.items():
                setattr(config, key, value)

    def _apply_plan(self, policy: Dict, planned: ResolvedPlan) -> None:
        """Add ``shard_sizes`` to the paired layers' kwargs and this rank's attention sizes."""
        _, rank = self._tp()
        table = PLANNED[planned.dims.family]
        plans = {"q": planned.q, "kv": planned.kv, "mlp": planned.mlp}
        found = set()
        for description in policy.values():
            replacements = description.sub_module_replacement or []
            hit = False
            for i, replacement in enumerate(replacements):
                kind = table.get(replacement.suffix)
                if kind is None:
                    continue
                kwargs = dict(replacement.kwargs or {}, shard_sizes=plans[kind].sizes)
                replacements[i] = dataclasses.replace(replacement, kwargs=kwargs)
                found.add(replacement.suffix)
                hit = True
            if hit:
                heads, kv_heads = planned.heads(rank)
                prefix = attention_path(planned.dims.family)
                update = {f"{prefix}.{key}": value for key, value in attention_attributes(
                    planned.dims.family, width=planned.q.sizes[rank], heads=heads, kv_heads=kv_heads).items()}
                description.attribute_replacement = dict(description.attribute_replacement or {}, **update)
        missing = sorted(set(table) - found)
        if missing:
            raise ConfigError(f"SemiMigPolicy(shard_plan=...): {type(self.base).__name__} has no tensor-parallel "
                              f"replacement for {', '.join(missing)}; this policy cannot take an uneven plan")

    def _check_planned_swapped(self, policy: Dict) -> None:
        """Every layer given ``shard_sizes`` must be semimig's (Colossal-AI's would not know the argument)."""
        ours = tuple(SWAPS.values())
        for key, description in policy.items():
            for replacement in description.sub_module_replacement or []:
                if "shard_sizes" in (replacement.kwargs or {}) and replacement.target_module not in ours:
                    where = f"{getattr(key, '__name__', key)}.{replacement.suffix}"
                    raise ConfigError(f"SemiMigPolicy(shard_plan=...): {where} stays Colossal-AI's "
                                      f"{getattr(replacement.target_module, '__name__', replacement.target_module)} "
                                      f"({self.unbalanced.get(where, 'not servable')}); uneven shards need "
                                      "semimig's layers")

    def _report(self, heads: Dict[str, str]) -> None:
        """Log the outcome once per distinct outcome (module_policy may be asked more than once)."""
        outcome = (tuple(self.swapped), tuple(self.unbalanced.items()), tuple(heads.items()))
        if outcome == self._reported:
            return
        self._reported = outcome
        base = type(self.base).__name__
        if self.unbalanced:
            logger.warning("SemiMigPolicy: %d tensor-parallel linear layer(s) of %s stay Colossal-AI's and are "
                           "NOT balanced: %s", len(self.unbalanced), base,
                           "; ".join(f"{where} ({why})" for where, why in self.unbalanced.items()))
        elif not self.swapped and (getattr(self, "shard_config", None) is None or self._tp()[0] > 1):
            # tp 1: nothing to swap, and semimig.enable says so once
            logger.warning("SemiMigPolicy: %s replaces no tensor-parallel linear layer; semimig balances nothing", base)
        if self.swapped:
            logger.info("SemiMigPolicy: semimig layers for %s", ", ".join(self.swapped))
        if heads:
            logger.info("SemiMigPolicy: output heads stay Colossal-AI's (never balanced): %s",
                        ", ".join(f"{where} ({cls})" for where, cls in heads.items()))

    def __getattr__(self, name: str):
        # Anything else a model policy offers (e.g. pipeline helpers) comes from the base.
        base = self.__dict__.get("base")
        if base is None:
            raise AttributeError(name)
        return getattr(base, name)

    def _require_base(self) -> Policy:
        if self.base is None:
            raise RuntimeError("SemiMigPolicy.set_model must be called before the policy is used")
        return self.base
