"""What every semimig linear layer adds to Colossal-AI's: a balancing directive and the shared forwards.

Every layer (plain, packed, GPT-2 ``Conv1D``; ShardFormer and legacy flavours) runs one of two
forwards, differing only in how the layer's outputs or inputs are gathered or split:

column (``w = gemm_weight  # [N/e, K]``)::

    y  = column_parallel_linear(x, w, b)                 (semimig.nn.functional; dx all-reduced)
    y  = gather_out(y)                                   gather_output only (layer-specific order)

row (``w = gemm_weight  # [N, K/e]``)::

    x  = split_in(x)                                     parallel_input=False only
    y  = row_parallel_linear(x, w) + b                   (y all-reduced)

With ``split_gather`` sequence parallelism both take the sequence dimension and run Colossal-AI's
collectives: the column layer all-gathers the sequence before its GEMM and reduce-scatters ``dx``
back to this rank's chunk; the row layer reduce-scatters ``y`` along the sequence and all-gathers
``dy``.  The same collectives on the same tensors as Colossal-AI's layers, so the same numbers and
the same bytes; the directive's GEMMs run on the gathered sequence unchanged.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple, Union

import torch

from semimig.comm import primitives as P
from semimig.comm.holders import HolderSum, holders_of, skipping
from semimig.errors import ConfigError
from semimig.nn.conversion import check_constructor, check_divisible, check_options, check_split_sizes
from semimig.nn.directive import LayerDirective
from semimig.nn.functional import column_parallel_linear, row_parallel_linear
from semimig.nn.spans import drop_pair_span, drop_pair_span_in_backward
from semimig.nn.uneven import Plans, presharded, uneven_plans

TensorFn = Callable[[torch.Tensor], torch.Tensor]
Output = Union[torch.Tensor, Tuple[torch.Tensor, Optional[torch.Tensor]]]


def _autocast(device: torch.device) -> bool:
    """Whether autocast is on for ``device``'s type (it then casts the GEMM's operands itself)."""
    try:
        return torch.is_autocast_enabled(device.type)
    except TypeError:  # torch < 2.4: no device argument
        return torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()


class BalancedLinearMixin:
    """Mixed into each semimig linear layer (both flavours).

    ``directive``  the :class:`LayerDirective` of the current iteration, or ``None`` (dense).
    ``layer_name`` the module's qualified name, set by the runtime when it binds the model.
    ``matrix_kind`` ``"column"`` or ``"row"``: which 1D tensor-parallel GEMM the layer runs.
    ``gemm_weight`` this rank's weight as the ``[N, K]`` matrix of its GEMMs (a view for layers
    that store ``[K, N]``, like GPT-2's ``Conv1D``); ``k_columns`` its ``K``.
    """

    matrix_kind: str = ""
    weight_transposed: bool = False  # stored [in, out] (GPT-2's Conv1D): the split dimension of the weight flips
    directive: Optional[LayerDirective]
    layer_name: Optional[str]
    shard_plans: Optional[Plans] = None
    """This rank's layout, one plan per packed part; ``None``: Colossal-AI's even layout (the legacy
    layers are always even)."""

    def _refuse_unservable(self, options: dict, process_group, in_features: int, out_features: int,
                           split_sizes: Optional[list] = None, shard_sizes: Optional[Sequence] = None, *,
                           bias: bool = True, dtype=None, device=None) -> Optional[Plans]:
        """Before Colossal-AI's constructor: refuse bad arguments (:func:`check_constructor`), options
        semimig cannot serve and a split dimension (``out`` for column, ``in`` for row layers; each
        part if packed) the group does not divide (:class:`~semimig.errors.ConfigError` naming the
        layer and the value).

        With ``shard_sizes`` (:mod:`semimig.nn.uneven`) the sizes must cover the split dimension (each
        packed part) instead; returns one :class:`~semimig.sharding.ShardPlan` per part, ``None`` when all
        are even or ``shard_sizes`` is absent."""
        name = type(self).__name__
        check_constructor(name, in_features=in_features, out_features=out_features, bias=bias, dtype=dtype,
                          device=device, process_group=process_group)
        tp_size = P.group_size(process_group)
        check_options(name, options)
        split, size = ("in_features", in_features) if self.matrix_kind == "row" else ("out_features", out_features)
        if shard_sizes is not None:
            if split_sizes is not None:
                check_split_sizes(name, split_sizes, split, size, 1)  # the parts must sum; divisibility not needed
            return uneven_plans(name, shard_sizes, split, size, tp_size, split_sizes)
        if split_sizes is None:
            check_divisible(name, split, size, tp_size)
        else:
            check_split_sizes(name, split_sizes, split, size, tp_size)
        return None

    def _init_balancing(self) -> None:
        self.directive = None
        self.layer_name = None
        self._holder_sum: Optional[tuple] = None  # (the plans' sizes, their HolderSum or None)

    @property
    def gemm_weight(self) -> torch.Tensor:
        """This rank's weight shard as ``[N, K]`` (the stored weight; Conv1D layers return a view)."""
        return self.weight

    @property
    def k_columns(self) -> int:
        """``K`` of this rank's GEMMs: the width of :attr:`gemm_weight`."""
        return self.gemm_weight.shape[-1]

    def _active_directive(self) -> Optional[LayerDirective]:
        """The directive while training; evaluation always runs densely and untimed."""
        return self.directive if self.training else None

    def _check_input(self, input_: torch.Tensor, expected: int) -> None:
        """The input before any GEMM or collective: a floating tensor of at least one dimension, on
        the weight's device, of the weight's dtype (unless autocast casts it), ``expected`` wide.
        :class:`~semimig.errors.ConfigError` (a ``ValueError``) names the layer and the value."""
        name, weight = type(self).__name__, self.gemm_weight
        if not isinstance(input_, torch.Tensor):
            raise ConfigError(f"{name} input must be a torch.Tensor, got {type(input_).__name__}")
        if input_.dim() < 1:
            raise ConfigError(f"{name} input must have at least one dimension (features last), got a 0-d tensor")
        if input_.device != weight.device:
            raise ConfigError(f"{name} input is on {input_.device} but the layer's weight is on {weight.device}")
        if input_.dtype != weight.dtype and not (input_.is_floating_point() and _autocast(input_.device)):
            raise ConfigError(f"{name} input has dtype {input_.dtype} but the layer's weight has dtype {weight.dtype}")
        if input_.shape[-1] != expected:
            raise ConfigError(
                f"{name} expects inputs of width {expected} (last dimension), "
                f"got shape {tuple(input_.shape)}"
            )

    # --- sequence parallelism (split_gather): see the module docstring --------------------
    def _sequence_split(self) -> bool:
        return getattr(self, "seq_parallel_mode", None) == "split_gather"

    def _sequence_dim(self) -> int:
        return getattr(self, "seq_parallel_dim", 1)  # GPT-2's layers have no attribute: Colossal-AI uses 1

    # --- the two forwards -----------------------------------------------------------------
    def _column_forward(self, input_: torch.Tensor, gather_out: TensorFn) -> Output:
        weight = self.gemm_weight  # [N/e, K]
        self._check_input(input_, weight.shape[-1])
        seq_dim = self._sequence_dim() if self._sequence_split() else None
        bias = None if self.skip_bias_add else self.bias
        directive = self._active_directive()
        if directive is not None and directive.rows is not None and (self.gather_output or self.skip_bias_add):
            raise ConfigError(f"{type(self).__name__} {self.layer_name}: paired pruning computes some output rows "
                              "only; a layer with gather_output or skip_bias_add cannot be paired")
        output = column_parallel_linear(input_, weight, bias, self.process_group, directive, seq_dim=seq_dim,
                                        holders=self._holders(directive, seq_dim))
        if self.gather_output:
            output = gather_out(output)
            drop_pair_span(directive)  # the gather is no pair's own work
        return (output, self.bias) if self.skip_bias_add else output

    def _holders(self, directive, seq_dim: Optional[int]) -> Optional[HolderSum]:
        """The holders' sum (:mod:`semimig.comm.holders`) when this layer's plan leaves a rank without a
        column; ``None`` (the group's all-reduce) with every rank holding some, along a split sequence
        (every rank holds its chunk of it) and while the layer migrates (a rank holding nothing may
        compute a straggler's columns).  Made once per plan."""
        plans = self.shard_plans
        if plans is None or seq_dim is not None or (directive is not None and directive.migrating):
            return None
        sizes = tuple(tuple(plan.sizes) for plan in plans)
        skip = skipping(self.process_group)
        cached = self._holder_sum
        if cached is None or cached[0] != (sizes, skip):
            held = holders_of(sizes)
            cached = ((sizes, skip), HolderSum(self.process_group, held, skip) if len(held) < len(sizes[0]) else None)
            self._holder_sum = cached
        return cached[1]

    def _row_forward(self, input_: torch.Tensor, split_in: TensorFn) -> Output:
        weight = self.gemm_weight  # [N, K/e]
        directive = self._active_directive()
        if directive is not None and directive.compact_input:
            if not self.parallel_input:
                raise ConfigError(f"{type(self).__name__} {self.layer_name}: a paired row layer takes its input "
                                  "split already (parallel_input=True)")
            self._check_input(input_, directive.keep.numel())  # the kept units only
        elif self.parallel_input:
            self._check_input(input_, weight.shape[-1])
        else:
            self._check_input(input_, weight.shape[-1] * P.group_size(self.process_group))
            input_ = split_in(drop_pair_span_in_backward(input_, directive))  # its backward gathers
        seq_dim = self._sequence_dim() if self._sequence_split() else None
        output = row_parallel_linear(input_, weight, self.process_group, directive, seq_dim=seq_dim,
                                     holders=self._holders(directive, seq_dim))
        if self.skip_bias_add:
            return output, self.bias
        return output + self.bias if self.bias is not None else output

    @torch.no_grad()
    def _init_row_parameters(self, weight_initializer, bias_initializer) -> None:
        """Colossal-AI's row-layer initialisation; the replicated bias is broadcast from the group's
        first rank on the bias's own device (Colossal-AI moves it to CUDA, which CPU lacks)."""
        weight_initializer(self.weight, fan_in=self.in_features, fan_out=self.out_features)
        if self.bias is not None:
            bias_initializer(self.bias, fan_in=self.in_features)
            P.broadcast_(self.bias.data, 0, self.process_group)

    def extra_repr(self) -> str:
        n, k = self.gemm_weight.shape
        active = "dense" if self.directive is None else f"balanced(iter={self.directive.iteration})"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, shard=[{n}, {k}], {active}"
        )


class BalancedShardFormerLinear(BalancedLinearMixin):
    """The ShardFormer flavour's constructor, Colossal-AI's signature: refuse what semimig cannot
    serve, build Colossal-AI's layer (the next class in the MRO), start dense.

    ``shard_sizes`` (optional, columns per rank along the split dimension) makes the shards uneven
    (:mod:`semimig.nn.uneven`); equal sizes or ``None`` are Colossal-AI's even layout."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: torch.dtype = None,
                 device: torch.device = None, process_group=None, shard_sizes: Optional[Sequence[int]] = None,
                 **kwargs) -> None:
        plans = self._refuse_unservable(kwargs, process_group, in_features, out_features, shard_sizes=shard_sizes,
                                        bias=bias, dtype=dtype, device=device)
        with presharded(type(self).__name__, self.matrix_kind, kwargs, plans, process_group,
                        transposed=self.weight_transposed):
            super().__init__(in_features, out_features, bias=bias, dtype=dtype, device=device,
                             process_group=process_group, **kwargs)
        self.shard_plans = plans  # None: Colossal-AI's even layout
        self._init_balancing()


class BalancedPackedLinear(BalancedLinearMixin):
    """:class:`BalancedShardFormerLinear` for packed layers, whose constructors take ``split_sizes`` third
    (``shard_sizes`` as there, applied part by part, see :mod:`semimig.nn.uneven`)."""

    def __init__(self, in_features: int, out_features: int, split_sizes: list, bias: bool = True,
                 dtype: torch.dtype = None, device: torch.device = None, process_group=None,
                 shard_sizes: Optional[Sequence] = None, **kwargs) -> None:
        plans = self._refuse_unservable(kwargs, process_group, in_features, out_features, split_sizes,
                                        shard_sizes=shard_sizes, bias=bias, dtype=dtype, device=device)
        with presharded(type(self).__name__, self.matrix_kind, kwargs, plans, process_group,
                        transposed=self.weight_transposed):
            super().__init__(in_features, out_features, split_sizes, bias=bias, dtype=dtype, device=device,
                             process_group=process_group, **kwargs)
        self.shard_plans = plans  # None: Colossal-AI's even layout
        self._init_balancing()
