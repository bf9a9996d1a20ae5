"""Uneven tensor-parallel shards built by the ShardFormer policy (DESIGN §8).

A user states a plan in the units of the two paired dimensions of a transformer block:

- ``mlp_units[r]``: blocks of ``block_size`` columns of the MLP intermediate dimension ``I``
  (rows of ``gate/up`` / GPT-2 ``c_fc``, the same columns of ``down`` / ``c_proj``);
- ``kv_units[r]``: KV groups, each one KV head and its ``n_q/n_kv`` query heads (GPT-2 and other
  multi-head models such as ViT: one head per group), i.e. ``(n_q/n_kv)·d`` rows of ``q``, ``d`` rows of
  ``k``, ``v`` and ``(n_q/n_kv)·d`` columns of ``o`` (``d`` = ``head_dim``).

``None`` for either keeps that dimension even (``tp`` must divide it).  :meth:`UnevenPlan.resolve`
checks the plan against the model (the units sum to the dimension, the block size divides ``I``;
a rank may hold zero units of either kind) and gives the three column plans the layers take as
``shard_sizes``; rank ``r``'s attention then has ``h_r = kv_units[r]·n_q/n_kv`` query heads,
``kv_units[r]`` KV heads and width ``h_r·d``.  Any plan computes the same function as the even
one: only the order of the sums over ``I`` and over the heads' columns of ``o`` changes.

:func:`plan_from_flags` parses the command-line form ``MLP_UNITS[:KV_UNITS]`` (``"28,4:3,1"``);
:func:`plan_for_speeds` solves a plan from per-rank speeds and the replicated share of a step
(:func:`semimig.sharding.solve_plan`, the same shares for both dimensions, rounded per dimension).
Supported models: :data:`SUPPORTED` (Llama-family GQA, GPT-2's fused QKV and ViT's separate
``query``/``key``/``value``); every other model is refused in one line naming it.
:func:`attention_attributes` gives each family's per-rank attention attributes (the policy sets
them at build, :mod:`semimig.shardformer.replan` after a move).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

from semimig._validate import check_int, check_number
from semimig.errors import ConfigError
from semimig.sharding.plan import ShardPlan, kv_group_unit, units_of
from semimig.sharding.solver import StepModel, solve_plan

__all__ = ["UnevenPlan", "ModelDims", "ResolvedPlan", "model_dims", "plan_from_flags", "plan_for_speeds",
           "speeds_from_flag", "attention_attributes", "SUPPORTED", "DEFAULT_BLOCK_SIZE"]

LLAMA_LIKE = ("llama", "qwen2", "mistral")
SUPPORTED = LLAMA_LIKE + ("gpt2", "vit")
"""``config.model_type`` values whose policies take an uneven plan."""

DEFAULT_BLOCK_SIZE = 128
"""Columns of the MLP intermediate dimension per MLP unit, unless the plan says otherwise."""


@dataclass(frozen=True)
class ModelDims:
    """What a plan is checked against: ``family`` (``"llama"`` for the Llama-like, ``"gpt2"`` or ``"vit"``),
    query heads, KV heads, ``head_dim`` and the MLP intermediate size."""

    family: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int


def model_dims(config: Any) -> ModelDims:
    """The dimensions of a Hugging Face ``config``; :class:`ConfigError` naming the model if unsupported."""
    kind = getattr(config, "model_type", None)
    if kind in LLAMA_LIKE:
        heads = config.num_attention_heads
        kv = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return ModelDims("llama", heads, kv, head_dim, config.intermediate_size)
    if kind == "gpt2":
        return ModelDims("gpt2", config.n_head, config.n_head, config.n_embd // config.n_head,
                         config.n_inner or 4 * config.n_embd)
    if kind == "vit":
        heads = config.num_attention_heads
        return ModelDims("vit", heads, heads, config.hidden_size // heads, config.intermediate_size)
    archs = getattr(config, "architectures", None) or [type(config).__name__]
    raise ConfigError(f"uneven shards (shard_plan) support the model types {', '.join(SUPPORTED)}; "
                      f"got model_type={kind!r} ({archs[0]}): use shard_plan=None for it")


def attention_attributes(family: str, *, width: int, heads: int, kv_heads: int) -> dict:
    """One rank's attributes of a ``family`` attention module holding ``heads`` query heads,
    ``kv_heads`` KV heads and ``width = heads · head_dim`` columns of the attention's output
    (Hugging Face's names: Llama-like ``hidden_size``/``num_heads``/``num_key_value_heads``, GPT-2
    ``embed_dim``/``split_size``/``num_heads``, ViT ``all_head_size``/``num_attention_heads``)."""
    if family == "llama":
        return {"hidden_size": width, "num_heads": heads, "num_key_value_heads": kv_heads}
    if family == "gpt2":
        # GPT-2 splits c_attn's [Q, K, V] output by split_size; a size 0 would give one piece, so a rank
        # holding no head splits by the three (empty) part widths instead
        return {"embed_dim": width, "split_size": width if width else [0, 0, 0], "num_heads": heads}
    if family == "vit":
        return {"all_head_size": width, "num_attention_heads": heads}
    raise ConfigError(f"attention_attributes: unknown model family {family!r} (llama, gpt2 or vit)")


@dataclass(frozen=True)
class ResolvedPlan:
    """A plan checked against one model at one ``tp``: column plans for the layers' ``shard_sizes``.

    ``mlp``   units of ``block_size`` columns of ``I`` (gate/up/down, c_fc/c_proj);
    ``q``     KV groups in ``q`` rows (``(n_q/n_kv)·d`` each): q and o, GPT-2's c_attn parts and c_proj;
    ``kv``    the same KV groups in ``k``/``v`` rows (``d`` each).
    """

    dims: ModelDims
    mlp: ShardPlan
    q: ShardPlan
    kv: ShardPlan

    @property
    def is_even(self) -> bool:
        return self.mlp.is_even and self.q.is_even

    def heads(self, rank: int) -> Tuple[int, int]:
        """``(query heads, KV heads)`` of rank ``rank``."""
        groups = self.kv.units[rank]
        return groups * (self.dims.num_heads // self.dims.num_kv_heads), groups


def _units(name: str, value: Any) -> Optional[Tuple[int, ...]]:
    if value is None:
        return None
    if isinstance(value, ShardPlan):
        return value.units
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise ConfigError(f"{name} must be a tuple of ints (units per tensor-parallel rank) or None, got {value!r}")
    try:
        return ShardPlan(units=tuple(value)).units
    except ConfigError as err:
        raise ConfigError(f"{name}={tuple(value)!r}: {err}") from None


@dataclass(frozen=True, kw_only=True)
class UnevenPlan:
    """Per tensor-parallel rank (group order): MLP blocks and KV groups it holds (see module doc).

    ``mlp_units``   blocks of ``block_size`` intermediate columns per rank, or ``None`` (even);
    ``kv_units``    KV groups per rank, or ``None`` (even);
    ``block_size``  columns per MLP block (default :data:`DEFAULT_BLOCK_SIZE`).
    """

    mlp_units: Optional[Tuple[int, ...]] = None
    kv_units: Optional[Tuple[int, ...]] = None
    block_size: int = DEFAULT_BLOCK_SIZE

    def __post_init__(self) -> None:
        object.__setattr__(self, "mlp_units", _units("mlp_units", self.mlp_units))
        object.__setattr__(self, "kv_units", _units("kv_units", self.kv_units))
        check_int("block_size", self.block_size, minimum=1)

    def resolve(self, config: Any, tp: int) -> ResolvedPlan:
        """The plan for ``config`` (a Hugging Face config) at ``tp`` ranks, or :class:`ConfigError`
        naming the value that does not fit."""
        check_int("tp", tp, minimum=1)
        dims = model_dims(config)
        q_cols, kv_cols = kv_group_unit(num_heads=dims.num_heads, num_kv_heads=dims.num_kv_heads,
                                        head_dim=dims.head_dim)
        if self.mlp_units is None:
            if dims.intermediate % tp:
                raise ConfigError(f"the MLP intermediate size {dims.intermediate} is not divisible by tp={tp}: "
                                  "give mlp_units explicitly")
            mlp = ShardPlan.even(tp, tp, unit_size=dims.intermediate // tp)
        else:
            mlp = ShardPlan(units=self.mlp_units, unit_size=self.block_size)
            mlp.check_tp(tp)
            blocks = units_of(f"the MLP intermediate size (block_size={self.block_size})", dims.intermediate,
                              self.block_size)
            if mlp.total_units != blocks:
                raise ConfigError(f"mlp_units={mlp.units} sum to {mlp.total_units} blocks, the MLP intermediate size "
                                  f"{dims.intermediate} is {blocks} blocks of {self.block_size}")
        if self.kv_units is None:
            groups = ShardPlan.even(dims.num_kv_heads, tp, unit_size=q_cols)
        else:
            groups = ShardPlan(units=self.kv_units, unit_size=q_cols)
            groups.check_tp(tp)
            if groups.total_units != dims.num_kv_heads:
                what = "KV heads" if dims.num_kv_heads != dims.num_heads else "attention heads"
                raise ConfigError(f"kv_units={groups.units} sum to {groups.total_units}, the model has "
                                  f"{dims.num_kv_heads} {what}")
        return ResolvedPlan(dims, mlp, groups, groups.with_unit_size(kv_cols))

    def __str__(self) -> str:
        mlp = "even" if self.mlp_units is None else f"{list(self.mlp_units)} x {self.block_size}"
        kv = "even" if self.kv_units is None else str(list(self.kv_units))
        return f"UnevenPlan(mlp={mlp}, kv_groups={kv})"


def _parse_side(flag: str, text: str, side: str, what: str) -> Optional[Tuple[int, ...]]:
    side = side.strip()
    if side in ("", "even"):
        return None
    out = []
    for item in side.split(","):
        try:
            out.append(int(item.strip()))
        except ValueError:
            raise ConfigError(f"{flag} {text!r}: {what} {side!r} must be comma-separated ints, "
                              f"got {item.strip()!r}") from None
    return tuple(out)


def plan_from_flags(text: Optional[str], config: Any, tp: int, *, block_size: int = DEFAULT_BLOCK_SIZE,
                    flag: str = "--shard-plan") -> Optional[UnevenPlan]:
    """``"MLP_UNITS[:KV_UNITS]"`` (e.g. ``"28,4:3,1"``; a side empty or ``even`` keeps it even) -> an
    :class:`UnevenPlan` checked against ``config`` at ``tp``; ``None`` for ``None``/``""``.

    :class:`ConfigError` naming ``flag`` and the bad value (syntax, a count per rank that is not
    ``tp``, a unit below 1, units not summing to the model's blocks or KV groups, an unsupported model).
    """
    if text is None or not str(text).strip():
        return None
    if not isinstance(text, str):
        raise ConfigError(f"{flag} must be a string like '28,4:3,1', got {text!r}")
    check_int("block_size", block_size, minimum=1)
    sides = text.split(":")
    if len(sides) > 2:
        raise ConfigError(f"{flag} {text!r}: expected MLP_UNITS[:KV_UNITS] (one ':'), got {len(sides) - 1}")
    mlp = _parse_side(flag, text, sides[0], "MLP_UNITS")
    kv = _parse_side(flag, text, sides[1], "KV_UNITS") if len(sides) == 2 else None
    for name, units in (("MLP_UNITS", mlp), ("KV_UNITS", kv)):
        if units is not None and len(units) != tp:
            raise ConfigError(f"{flag} {text!r}: {name} has {len(units)} entries, one per tensor-parallel rank "
                              f"is needed (tp={tp})")
    try:
        plan = UnevenPlan(mlp_units=mlp, kv_units=kv, block_size=block_size)
        plan.resolve(config, tp)
    except ConfigError as err:
        raise ConfigError(f"{flag} {text!r}: {err}") from None
    return plan


def plan_for_speeds(config: Any, speeds: Sequence[float], *, replicated_share: float,
                    block_size: int = DEFAULT_BLOCK_SIZE, min_units: int = 0) -> UnevenPlan:
    """The plan minimising the step (DESIGN §8) for ranks of relative ``speeds`` (``v_r``, e.g.
    ``(1, 0.25)``: rank 1 four times slower) when ``replicated_share`` (``ρ``) of a healthy even
    step is replicated work: :func:`~semimig.sharding.solve_plan` on
    ``StepModel.normalised(speeds, replicated_share=ρ)``, once in MLP blocks and once in KV groups,
    every rank keeping at least ``min_units`` of each (0: a rank too slow for one may hold none)."""
    model = StepModel.normalised(tuple(speeds), replicated_share=replicated_share)
    dims = model_dims(config)
    blocks = units_of(f"the MLP intermediate size (block_size={block_size})", dims.intermediate, block_size)
    mlp = solve_plan(model, total_units=blocks, unit_size=block_size, min_units=min_units)
    kv = solve_plan(model, total_units=dims.num_kv_heads, min_units=min_units)
    plan = UnevenPlan(mlp_units=mlp.units, kv_units=kv.units, block_size=block_size)
    plan.resolve(config, model.tp)
    return plan


def speeds_from_flag(text: str, tp: int, *, flag: str = "--shard-for-speeds") -> Tuple[float, ...]:
    """``"1,0.25"`` -> ``(1.0, 0.25)``: one speed ``> 0`` per tensor-parallel rank, or :class:`ConfigError`."""
    items = [item.strip() for item in str(text).split(",")]
    if len(items) != tp:
        raise ConfigError(f"{flag} {text!r}: {len(items)} speeds, one per tensor-parallel rank is needed (tp={tp})")
    speeds = []
    for r, item in enumerate(items):
        try:
            value = float(item)
        except ValueError:
            raise ConfigError(f"{flag} {text!r}: speed {item!r} of rank {r} is not a number") from None
        speeds.append(check_number(f"{flag} speed of rank {r}", value, minimum=0.0, low_open=True))
    return tuple(speeds)
