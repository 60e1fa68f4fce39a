"""The paper's cosine pattern (Section 3) as embeddings: what the InfoNCE and the sigmoid
gradient analyses (`gradients`, `sigmoid`) differentiate through the losses."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tfcl_jax import mappings


def paper_pattern(C: jax.Array, n: int) -> jax.Array:
  """The cosines `[C, -C, ..., -C]` of Sections 3-4: the positive at `C`, `n - 1` negatives at
  `-C` (Eq. 3's setting).

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.analysis import pattern
    >>> pattern.paper_pattern(jnp.array(0.5), 3).tolist()
    [0.5, -0.5, -0.5]
  """
  return jnp.concatenate([C[None], jnp.broadcast_to(-C, (n - 1,))])


def pattern_embeddings(cosines: jax.Array) -> tuple[jax.Array, jax.Array]:
  r"""Unit embeddings whose cosines with anchor row 0 are exactly `cosines`.

  Anchor `e_1`; candidate `j` is `c_j e_1 + sqrt(1 - c_j^2) e_{j+2}`, each in its
  own direction so candidates do not constrain each other. A differentiable
  function of `cosines` on `(-1, 1)`; at `|c| = 1` the derivative of the square
  root is infinite (any smooth path on the sphere meets a pole quadratically).

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.analysis import pattern
    >>> z1, z2 = pattern.pattern_embeddings(jnp.array([0.5, -0.5, -0.5]))
    >>> [round(c, 6) for c in (z1[0] @ z2.T).tolist()]
    [0.5, -0.5, -0.5]

  Args:
    cosines: `[N]` float cosines in `(-1, 1)`: candidate 0 is the positive.

  Returns:
    `(z1, z2)`, both `[N, N + 1]`: `z1[0]` the anchor, `z2` the candidates.
    Rows `1..N-1` of `z1` (anchors of other rows) repeat the candidates.
  """
  n = cosines.shape[0]
  sines = jnp.sqrt(jnp.maximum(1.0 - jnp.square(cosines), 0.0))
  eye = jnp.eye(n + 1, dtype=cosines.dtype)
  z2 = cosines[:, None] * eye[0] + sines[:, None] * eye[1:]
  z1 = z2.at[0].set(eye[0])
  return z1, z2


def as_given(mapping: mappings.MappingLike) -> mappings.Mapping:
  """`mapping` as the `Mapping` the analysis evaluates: at its params and its bound step (0 when
  none), bound so that the losses take it (they refuse an unbound learnable or scheduled one,
  which in training would silently not train or not anneal).

  A batch-scaled mapping (`mappings.calibrated_free()` ...) must be bound, `m.bind(scale=s)`: it
  is then `s 2 artanh(c)`. Unbound, its scale is solved by a loss from its batch, and the pattern
  `[C, -C, ..., -C]` is no such batch (`pattern_embeddings`' other rows only carry the pattern's
  candidates): refused with a `ValueError` that names the fix.

  Examples:
    >>> from tfcl_jax.analysis import pattern
    >>> held = pattern.as_given("learnable=0.5")
    >>> held.bound, round(float(held(0.25)), 4)
    (True, 0.5)
  """
  mapping = mappings.as_mapping(mapping)
  if mappings.batch_scaled(mapping):
    raise ValueError(
        f"mapping {mapping.spec!r} has a scale that a loss solves from its batch, and the "
        f"pattern [C, -C, ..., -C] is no such batch: bind the scale to analyse, "
        f"mapping.bind(scale=s) (s 2 artanh(c); losses.batch_scale gives a batch's s).")
  return mapping.bind(params=mapping.params, step=mapping.bound_step())
