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
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Dict, List, Optional, Union

import torch.nn as nn
from colossalai.shardformer import layer as cai
from colossalai.shardformer.layer.parallel_module import ParallelModule
from colossalai.shardformer.policies.auto_policy import get_autopolicy
from colossalai.shardformer.policies.base_policy import ModulePolicyDescription, Policy
from colossalai.shardformer.shard import ShardConfig

import semimig.nn as snn
from semimig.errors import ConfigError
from semimig.nn.conversion import unsupported_options

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

    def __init__(self, base: Optional[Policy] = None) -> None:
        super().__init__()
        if base is not None and not isinstance(base, Policy):
            raise ConfigError(f"SemiMigPolicy(base=...) expects a colossalai Policy, got {type(base).__name__}")
        self.base = base
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
        return self.model

    def get_held_layers(self) -> List[nn.Module]:
        return self._require_base().get_held_layers()

    def get_shared_params(self):
        return self._require_base().get_shared_params()

    def module_policy(self) -> Dict[Union[str, nn.Module], ModulePolicyDescription]:
        """The base policy's descriptions, with each servable replacement's target swapped (see module doc)."""
        policy = self._require_base().module_policy()
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
        return policy

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
        elif not self.swapped:
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
