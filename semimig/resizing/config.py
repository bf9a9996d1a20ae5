"""Configuration of ZERO-resizing (paper Sec. III; DESIGN.md section 1).

Variants (paper Sec. V):

    rd         random keep set, ratio from Eq. 1
    pri        prune the columns with the smallest weight variation delta, ratio from Eq. 1
    pridiff-e  per-layer ratios max(share(delta < theta), alpha * gamma) with the empirical
               gamma = ``empirical_gamma`` (1/2 in the paper)
    pridiff-r  per-layer ratios max(share(delta < theta), alpha * g) with g chosen so that the
               FLOP-weighted savings equal Eq. 1's gamma (see :mod:`semimig.resizing.pridiff`)

PriDiff's threshold (``theta_mode``):

    relative   theta_k = theta_rel * median_c(delta_kc), per layer k (default; scale-free)
    absolute   theta   = N_iter * theta_iter, the paper's (an absolute weight change)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from semimig._validate import check_bool, check_choice, check_int, check_number

__all__ = ["BLOCKS", "VARIANTS", "IMPUTES", "THETA_MODES", "ResizingConfig"]

Variant = Literal["rd", "pri", "pridiff-e", "pridiff-r"]
Impute = Literal["zero", "same", "average"]
ThetaMode = Literal["relative", "absolute"]
VARIANTS: tuple[str, ...] = ("rd", "pri", "pridiff-e", "pridiff-r")
IMPUTES: tuple[str, ...] = ("zero", "same", "average")
THETA_MODES: tuple[str, ...] = ("relative", "absolute")
BLOCKS: tuple[int, ...] = (1, 8, 16, 32)


@dataclass(frozen=True, kw_only=True)
class ResizingConfig:
    """ZERO-resizing settings; every field is validated, errors name the field and the value."""

    variant: Variant = "pri"
    """Column selection and ratio rule, one of ``VARIANTS``.  Inside a
    :class:`~semimig.controller.BalanceConfig` a ``zero-*`` mode names it (a different one here,
    other than the default, is refused)."""
    gamma_max: float = 0.9
    """Upper clamp of every pruning ratio, in [0, 1)."""
    impute: Impute = "zero"
    """Value of pruned weight-gradient columns: ``zero``, ``same`` (previous iteration's), ``average``."""
    alpha: float = 0.8
    """PriDiff decay: a layer prunes at least ``alpha * gamma``; in (0, 1]."""
    theta_mode: ThetaMode = "relative"
    """How PriDiff's threshold is set: ``relative`` to each layer's own column changes (the
    default: it means the same for any optimizer and learning-rate schedule) or ``absolute``
    (the paper's ``N_iter * theta_iter``)."""
    theta_rel: float = 0.5
    """Relative threshold: a column is a pruning candidate when it moved less than ``theta_rel``
    times the median change of its layer's columns in the period; in (0, 10]."""
    theta_iter: float = 1e-3
    """Absolute micro-threshold (``theta_mode="absolute"``): theta = iterations per period * theta_iter; >= 0."""
    period: Optional[int] = None
    """Statistics period in iterations (>= 1); None = iterations per epoch when known."""
    revisit_pruned: bool = True
    """Algorithm 1's list puts the columns pruned in the last period after every column computed
    in it, so pruned columns are computed and measured again instead of staying pruned on an old
    ``delta`` (:mod:`semimig.resizing.priority`); False: the paper's list as written."""
    empirical_gamma: float = 0.5
    """The fixed gamma of ``pridiff-e`` (paper: 1/2); in [0, 1)."""
    seed: int = 0
    """Seed of the random keep sets (``rd``); >= 0."""
    block: int = 1
    """Granularity of the prioritized keep sets: whole aligned blocks of ``block`` columns (1 =
    single columns, the paper; 8, 16 or 32: block-granular priority lists, smallest mean weight
    change first, whose keep sets the keep layout and the grouped kernels take).  The
    controller prunes ``round(n / block)`` whole blocks where ``n`` columns are asked for, and
    single columns in a layer whose own column count ``block`` does not divide."""
    paired: bool = True
    """Paired pruning (the default): in an MLP of a known class (``LlamaMLP``, ``MistralMLP``,
    ``Qwen2MLP``, ``GPT2MLP``) the row layer's kept columns are the MLP's kept intermediate units
    for the step; the column layers feeding it compute only those output rows and keep their whole
    K, and the activation between them is compact (no gather or scatter of it).  The same FLOPs as
    pruning each layer's K by the row layer's ratio, one approximation (units off for the step)
    instead of two; exact against the row layer pruned alone.  Planned prunes, and the MLPs a
    step reaches after the step reflex fired (:mod:`semimig.controller.reflex`; an MLP it fires
    inside, and a step that migrates, prune each layer's own K as before); a model with no such
    MLP prunes each layer's own K and says so in one INFO line.  The default because, in
    multi-repeat time-to-loss runs on real text under a real or whole-device straggler, paired
    pruning mostly ends lower or reaches healthy's loss more often, at the same step time (one
    approximation per MLP instead of two).  False: every layer prunes its own K (the paper)."""

    def __post_init__(self) -> None:
        check_choice("variant", self.variant, VARIANTS)
        check_choice("impute", self.impute, IMPUTES)
        check_choice("theta_mode", self.theta_mode, THETA_MODES)
        check_number("gamma_max", self.gamma_max, minimum=0.0, maximum=1.0, high_open=True)
        check_number("alpha", self.alpha, minimum=0.0, maximum=1.0, low_open=True)
        check_number("theta_rel", self.theta_rel, minimum=0.0, maximum=10.0, low_open=True)
        check_number("theta_iter", self.theta_iter, minimum=0.0)
        check_int("period", self.period, minimum=1, allow_none=True)
        check_number("empirical_gamma", self.empirical_gamma, minimum=0.0, maximum=1.0, high_open=True)
        check_bool("revisit_pruned", self.revisit_pruned)
        check_int("seed", self.seed, minimum=0, maximum=2**63 - 1)
        check_choice("block", self.block, BLOCKS)
        check_bool("paired", self.paired)

    @property
    def prioritized(self) -> bool:
        """True when columns are chosen by smallest variation (every variant but ``rd``)."""
        return self.variant != "rd"

    @property
    def differentiated(self) -> bool:
        """True for the PriDiff variants (per-layer ratios)."""
        return self.variant in ("pridiff-e", "pridiff-r")

    def theta(self, iterations_per_period: int) -> float:
        """The absolute PriDiff threshold ``theta = N_iter * theta_iter``."""
        check_int("iterations_per_period", iterations_per_period, minimum=1)
        return iterations_per_period * self.theta_iter
