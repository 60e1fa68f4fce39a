"""The kernels a backend declares: one method per role that `_pallas`'s plan calls.

A backend is a module (`_kernel_triton`, `_kernel_tpu`) that provides the four functions of
`Kernels`; the Triton backend also has `PairKernels` (`_kernel_triton_pairs`), the kernels that
serve both sides of a tile. `_pallas.BACKENDS` and `_pallas.PAIRS` are typed by these protocols,
so a backend that lacks a role, or names one differently, fails the type check rather than at
a `getattr` in a traced program. Every kernel takes the traced mapping (`KernelMapping`), the
backend's `Tiles`, and `theta` (the mapping's scalars as one vector) first.

Roles (`U`: the anchors' sides, `V`: the candidates', `lse`/`g`: a side's logsumexps and their
cotangents):

* `forward(a, b)`: each row of `a`'s logsumexp over its negatives in `b`;
* `row_grads`: `dU` (and `dtheta`) from the row statistics and, with `columns`, the column
  statistics; `col_grads`: `dV`;
* the pair kernels: `symmetric_forward`/`symmetric_grads` (`S = U U^T`, each tile once), and
  `two_sided_forward`/`both_grads` (the rows and columns of `S = U V^T` in one pass).
"""

from __future__ import annotations

from typing import Any, Protocol

import jax

from tfcl_jax.losses._engine._tiles import Side
from tfcl_jax.losses._kernels._kernel_math import KernelMapping


class Tiles(Protocol):
  """A backend's choice of tiles for one problem."""

  @property
  def block(self) -> int:
    """The largest block, to which `N` is padded."""
    ...

  @property
  def columns(self) -> tuple[str, str]:
    """How a tile's column side is sent, forward and backward (`"separate"`: by the row and
    column kernels; the others need `PairKernels`)."""
    ...

  def padded_dim(self, dim: int) -> int:
    """`D` as the kernels take it (padded with zeros)."""
    ...

  def blocks(self) -> set[int]:
    """Every tile side the kernels use (the mapping is traced once per tile shape)."""
    ...


class Kernels(Protocol):
  """One backend's kernels: the tiles it picks, its forward and its two backward kernels."""

  def tiles(self, num_rows: int, num_cols: int, dim: int, block_size: int | None,
            dtype: Any = ..., /) -> Tiles: ...

  def forward(self, mapping: KernelMapping, tiles_: Any, theta: jax.Array, a: Side, b: Side,
              /) -> jax.Array: ...

  def row_grads(self, mapping: KernelMapping, tiles_: Any, theta: jax.Array, rows: Side,
                cols: Side, r_lse: jax.Array, r_g: jax.Array, c_lse: jax.Array, c_g: jax.Array,
                /, *, columns: bool, theta_from_columns: bool) -> tuple[jax.Array, Any]:
    """`(dU, dtheta)`."""
    ...

  def col_grads(self, mapping: KernelMapping, tiles_: Any, theta: jax.Array, rows: Side,
                cols: Side, r_lse: jax.Array, r_g: jax.Array, c_lse: jax.Array, c_g: jax.Array,
                /, *, columns: bool) -> jax.Array: ...


class PairKernels(Protocol):
  """The kernels that serve both sides of a tile, the column side sent as `column_side` says."""

  def symmetric_forward(self, mapping: KernelMapping, tiles_: Any, theta: jax.Array, side: Side,
                        /, *, column_side: str) -> jax.Array: ...

  def two_sided_forward(self, mapping: KernelMapping, tiles_: Any, theta: jax.Array, rows: Side,
                        cols: Side, /, *, column_side: str) -> tuple[jax.Array, jax.Array]: ...

  def symmetric_grads(self, mapping: KernelMapping, tiles_: Any, theta: jax.Array, side: Side,
                      lse: jax.Array, g_: jax.Array, /, *,
                      column_side: str) -> tuple[jax.Array, Any]: ...

  def both_grads(self, mapping: KernelMapping, tiles_: Any, theta: jax.Array, rows: Side,
                 cols: Side, r_lse: jax.Array, r_g: jax.Array, c_lse: jax.Array, c_g: jax.Array,
                 /, *, columns: bool,
                 column_side: str) -> tuple[jax.Array, jax.Array, Any]: ...
