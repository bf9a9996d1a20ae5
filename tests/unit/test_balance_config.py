"""BalanceConfig keeps the sub-configs the user built and computes what it derives from them.

The plan mode, a ``zero-*`` mode's resizing variant and ``gamma_max`` each have one source
(:attr:`BalanceConfig.mode`, :attr:`BalanceConfig.resizing`); the copies the decision core and the
layer binding read are computed from it, and a sub-config value that contradicts it is refused.
"""
from __future__ import annotations

import copy
import dataclasses

import pytest

from semimig.controller import BalanceConfig, ControllerConfig
from semimig.errors import ConfigError
from semimig.modes import CONTROLLER_MODES, Mode
from semimig.resizing.config import ResizingConfig


@pytest.mark.parametrize("mode", CONTROLLER_MODES)
def test_the_users_sub_configs_are_kept_as_given(mode):
    resizing = ResizingConfig(gamma_max=0.6, seed=3)
    controller = ControllerConfig(tol=0.1, window=9)
    before = (copy.deepcopy(resizing), copy.deepcopy(controller))
    config = BalanceConfig(mode=mode, resizing=resizing, controller=controller)
    assert config.resizing is resizing and config.controller is controller
    assert (config.resizing, config.controller) == before


@pytest.mark.parametrize("mode", CONTROLLER_MODES)
def test_derived_values_follow_the_mode_and_resizing(mode):
    config = BalanceConfig(mode=mode, resizing=ResizingConfig(gamma_max=0.6))
    want_variant = Mode(mode).variant or "pri"
    assert config.plan_mode == Mode(mode).plan_mode
    assert config.variant == want_variant and config.gamma_max == 0.6
    planning = config.controller_in_force()
    assert (planning.mode, planning.gamma_max) == (Mode(mode).plan_mode, 0.6)
    assert dataclasses.replace(planning, mode="semi", gamma_max=0.9) == config.controller  # nothing else differs
    pruning = config.resizing_in_force()
    assert pruning.variant == want_variant
    assert dataclasses.replace(pruning, variant="pri") == config.resizing


def test_semi_keeps_its_resizing_variant_and_migrators():
    config = BalanceConfig(mode="semi", resizing=ResizingConfig(variant="pridiff-r"),
                           controller=ControllerConfig(migrators=1))
    assert config.variant == "pridiff-r" and config.resizing_in_force() is config.resizing
    assert config.controller_in_force() is config.controller  # it already plans as semi, gamma_max 0.9
    assert config.controller_in_force().migrators == 1


def test_a_changed_mode_derives_afresh():
    """A copy with another mode (what ``semimig.enable(mode=..., config=...)`` makes) reads the
    variant of its own mode, not one a previous mode left in the sub-config."""
    zero_rd = BalanceConfig(mode="zero-rd")
    semi = dataclasses.replace(zero_rd, mode="semi")
    assert (zero_rd.variant, semi.variant, semi.resizing.variant) == ("rd", "pri", "pri")
    assert dataclasses.replace(semi, mode="zero-pridiff-e").controller_in_force().mode == "zero"


@pytest.mark.parametrize("kwargs, match", [
    ({"resizing": ResizingConfig(gamma_max=0.5), "controller": ControllerConfig(gamma_max=0.7)},
     r"controller.gamma_max=0.7 disagrees with resizing.gamma_max=0.5: set it once, on resizing"),
    ({"mode": "zero-pri", "controller": ControllerConfig(mode="mig")},
     r"controller.mode='mig' disagrees with mode='zero-pri', which plans as 'zero'"),
    ({"mode": "semi", "controller": ControllerConfig(mode="zero")},
     r"controller.mode='zero' disagrees with mode='semi', which plans as 'semi'"),
    ({"mode": "zero-rd", "resizing": ResizingConfig(variant="pridiff-r")},
     r"resizing.variant='pridiff-r' disagrees with mode='zero-rd', which names the variant 'rd'"),
    ({"mode": "mig", "controller": ControllerConfig(migrators=1)},
     r"controller.migrators \(λ=1\) needs mode 'semi', got 'mig'"),
])
def test_a_sub_config_that_contradicts_the_one_source_is_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        BalanceConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [
    {"mode": "zero-pri", "controller": ControllerConfig(mode="zero")},
    {"mode": "zero-rd", "resizing": ResizingConfig(variant="rd")},
    {"resizing": ResizingConfig(gamma_max=0.5), "controller": ControllerConfig(gamma_max=0.5)},
])
def test_a_sub_config_that_agrees_is_accepted(kwargs):
    config = BalanceConfig(**kwargs)
    assert config.controller is kwargs.get("controller", config.controller)
    assert config.resizing is kwargs.get("resizing", config.resizing)
