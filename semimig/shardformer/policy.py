"""``SemiMigPolicy``: any Colossal-AI ShardFormer policy, with semimig's linear layers swapped in.

    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, custom_policy=SemiMigPolicy())
    model, _ = ShardFormer(shard_config).optimize(model, policy=SemiMigPolicy())

The wrapped policy (``base``; Colossal-AI's auto policy for the model when ``None``) decides
everything as usual; only the replacement targets change, exactly by class:

    colossalai.shardformer.layer.Linear1D_Col  ->  semimig.nn.Linear1D_Col
    colossalai.shardformer.layer.Linear1D_Row  ->  semimig.nn.Linear1D_Row

Subclasses of those (``VocabParallelLMHead1D``, ``PaddingLMHead``) and other layer classes
(GPT-2's fused ``GPT2FusedLinearConv1D_Col/Row``, ``FusedLinear1D_Col``, ``LinearWithGradAccum``)
are left to Colossal-AI.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Dict, List, Optional, Union

import torch.nn as nn
from colossalai.shardformer.layer import Linear1D_Col as _CaiCol
from colossalai.shardformer.layer import Linear1D_Row as _CaiRow
from colossalai.shardformer.policies.auto_policy import get_autopolicy
from colossalai.shardformer.policies.base_policy import ModulePolicyDescription, Policy
from colossalai.shardformer.shard import ShardConfig

import semimig.nn as snn

logger = logging.getLogger(__name__)

SWAPS = {_CaiCol: snn.Linear1D_Col, _CaiRow: snn.Linear1D_Row}


class SemiMigPolicy(Policy):
    """Wraps ``base`` (a Colossal-AI ``Policy``, or None for the model's auto policy)."""

    def __init__(self, base: Optional[Policy] = None) -> None:
        super().__init__()
        if base is not None and not isinstance(base, Policy):
            raise TypeError(f"SemiMigPolicy(base=...) expects a colossalai Policy, got {type(base).__name__}")
        self.base = base
        self.swapped: List[str] = []

    # --- the Policy protocol, delegated --------------------------------------------------
    def set_model(self, model: nn.Module) -> None:
        super().set_model(model)
        if self.base is None:
            try:
                self.base = get_autopolicy(model)
            except NotImplementedError as err:
                raise ValueError(
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
        policy = self._require_base().module_policy()
        self.swapped = []
        for key, description in policy.items():
            for i, replacement in enumerate(description.sub_module_replacement or []):
                target = SWAPS.get(replacement.target_module)
                if target is not None:
                    description.sub_module_replacement[i] = dataclasses.replace(replacement, target_module=target)
                    self.swapped.append(f"{getattr(key, '__name__', key)}.{replacement.suffix}")
        if not self.swapped:
            logger.warning("SemiMigPolicy: %s replaces no Linear1D_Col/Row; semimig balances nothing",
                           type(self.base).__name__)
        else:
            logger.info("SemiMigPolicy: semimig layers for %s", ", ".join(self.swapped))
        return policy

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
