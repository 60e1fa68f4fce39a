r"""Label-free scores of a learnt representation: what can rank runs without a labelled split.

RankMe (Garrido et al. 2023), α-ReQ (Agrawal et al. 2022), LiDAR (Thilak et al. 2024), alignment
and uniformity (Wang & Isola 2020, from `tfcl_jax.analysis.geometry`) and view-to-view retrieval.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tfcl_jax import _checks, losses
from tfcl_jax.analysis.geometry import alignment, uniformity

__all__ = ["alignment", "alpha_req", "lidar", "rankme", "scores", "uniformity",
           "view_retrieval_top1"]

#: RankMe's ε (Garrido et al. 2023, Eq. 1).
RANKME_EPSILON = 1e-7
#: LiDAR's ridge δ on the within-sample covariance and its ε in the entropy (Thilak et al. 2024).
LIDAR_DELTA = 1e-4
LIDAR_EPSILON = 1e-8
#: α-ReQ's fit: eigenvalue ranks 6-100 (1-based), as Agrawal et al.'s code fits the spectrum.
ALPHA_FIRST_RANK = 6
ALPHA_LAST_RANK = 100


def _matrix(z, *, name: str, min_rows: int = 1) -> jax.Array:
  z = _checks.float_matrix(z, name=name)
  if z.shape[0] < min_rows:
    raise ValueError(f"{name} must have at least {min_rows} rows, got shape {z.shape}.")
  return z.astype(_checks.compute_dtype(z.dtype))


def _entropy_rank(values: jax.Array, epsilon: float) -> jax.Array:
  """`exp(-Σ p log p)` with `p = values / ||values||_1 + ε`: RankMe's and LiDAR's effective rank.
  The ε keeps `p log p` finite at zero values and lets an all-zero spectrum read as rank 1."""
  p = values / jnp.maximum(jnp.sum(values), jnp.finfo(values.dtype).tiny) + epsilon
  return jnp.exp(-jnp.sum(p * jnp.log(p)))


def rankme(z: jax.typing.ArrayLike, *, epsilon: float = RANKME_EPSILON) -> jax.Array:
  r"""RankMe: the entropy-effective rank of the embeddings (Garrido et al. 2023, Eq. 1).

  With `σ_k` the singular values of `z` (not centred, as in the paper),

  .. math:: p_k = \frac{\sigma_k}{\|\sigma\|_1} + \epsilon, \qquad
            \mathrm{RankMe}(z) = \exp\Big(-\sum_{k=1}^{\min(N, D)} p_k \log p_k\Big)

  It is `min(N, D)` for orthogonal rows of equal norm, about `D` for isotropic Gaussian rows
  (`N ≫ D`), about `k` for rows in a `k`-dimensional subspace with equal spread and 1 for
  collapsed rows. It reads the spread of the spectrum only: a sharper temperature, which
  spreads the embeddings, raises it whether or not the spread carries information.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.evaluation import label_free
    >>> round(label_free.rankme(jnp.eye(4)).item(), 3)
    4.0
    >>> round(label_free.rankme(jnp.ones((5, 3))).item(), 3)  # collapsed
    1.0

  Args:
    z: `[N, D]` float embeddings.
    epsilon: `ε > 0` (keyword-only), `1e-7` as in Garrido et al.

  Returns:
    A float32 (float64 under x64 inputs) scalar in `[1, min(N, D)]` (up to `ε`).

  References:
    Garrido, Balestriero, Najman & LeCun, RankMe: Assessing the Downstream Performance of
    Pretrained Self-Supervised Representations by Their Rank, ICML 2023.
  """
  z = _matrix(z, name="z")
  _checks.positive_scalar(epsilon, name="epsilon")
  return _entropy_rank(jnp.linalg.svd(z, compute_uv=False), epsilon)


def alpha_req(z: jax.typing.ArrayLike, *, first_rank: int = ALPHA_FIRST_RANK,
              last_rank: int = ALPHA_LAST_RANK) -> jax.Array:
  r"""α-ReQ: the power-law decay exponent of the embedding covariance's eigenspectrum
  (Agrawal et al. 2022).

  With `λ_1 ≥ λ_2 ≥ …` the eigenvalues of the covariance of `z` (rows centred), α is the slope
  of the weighted least-squares line through `(log i, log λ_i)`,

  .. math:: \log \lambda_i \approx c - \alpha \log i, \qquad
            (\alpha, c) = \arg\min \sum_{i=a}^{b} \frac{1}{i}\,(\log\lambda_i - c + \alpha\log i)^2

  over ranks `a = first_rank … b = min(last_rank, min(N - 1, D))`, with weights `1/i`, as the
  authors' code fits it (after Stringer et al. 2019). Agrawal et al. find the best
  representations near `α = 1`; a large α is a fast decay (few directions carry the variance).
  An eigenvalue below `λ_1` times the float's resolution reads as that floor, so a
  rank-deficient spectrum gives a large, finite α.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.evaluation import label_free
    >>> ranks = jnp.arange(1.0, 9.0)
    >>> z = jnp.concatenate([jnp.diag(ranks ** -1.0), -jnp.diag(ranks ** -1.0)])  # λ_i ∝ i^-2
    >>> round(label_free.alpha_req(z, first_rank=1).item(), 3)
    2.0

  Args:
    z: `[N, D]` float embeddings, `N >= 3`.
    first_rank: the first eigenvalue rank of the fit, 1-based (keyword-only; 6 by default).
    last_rank: the last rank of the fit (keyword-only; 100 by default), capped at
      `min(N - 1, D)`, the number of eigenvalues a centred `[N, D]` matrix can have.

  Returns:
    A float32 (float64 under x64 inputs) scalar.

  Raises:
    ValueError: fewer than 2 ranks in the fit.

  References:
    Agrawal, Mondal, Ghosh & Richards, α-ReQ: Assessing Representation Quality in
    Self-Supervised Learning by Measuring Eigenspectrum Decay, NeurIPS 2022.
  """
  z = _matrix(z, name="z", min_rows=3)
  first_rank = _checks.positive_int(first_rank, name="first_rank")
  last_rank = _checks.positive_int(last_rank, name="last_rank")
  last = min(last_rank, z.shape[0] - 1, z.shape[1])
  if last - first_rank + 1 < 2:
    raise ValueError(
        f"alpha_req needs at least 2 eigenvalue ranks to fit, got ranks {first_rank}..{last} "
        f"(first_rank={first_rank}, last_rank={last_rank}, z of shape {z.shape}).")
  centred = z - jnp.mean(z, axis=0)
  eigenvalues = jnp.square(jnp.linalg.svd(centred, compute_uv=False)) / (z.shape[0] - 1)
  floor = eigenvalues[0] * jnp.finfo(z.dtype).eps + jnp.finfo(z.dtype).tiny
  log_values = jnp.log(jnp.maximum(eigenvalues[first_rank - 1:last], floor))
  log_ranks = jnp.log(jnp.arange(first_rank, last + 1, dtype=z.dtype))
  weights = 1.0 / jnp.arange(first_rank, last + 1, dtype=z.dtype)
  # Weighted least squares in closed form: the slope of log λ on log i.
  mean_x = jnp.sum(weights * log_ranks) / jnp.sum(weights)
  mean_y = jnp.sum(weights * log_values) / jnp.sum(weights)
  slope = (jnp.sum(weights * (log_ranks - mean_x) * (log_values - mean_y))
           / jnp.sum(weights * jnp.square(log_ranks - mean_x)))
  return -slope


def lidar(views: jax.typing.ArrayLike, *, delta: float = LIDAR_DELTA,
          epsilon: float = LIDAR_EPSILON) -> jax.Array:
  r"""LiDAR: the effective rank of the linear discriminant matrix with each sample's views as
  one class (Thilak et al. 2024).

  With `e_{xi}` the embedding of view `i` of sample `x` (`n` samples, `q` views each),
  `μ_x` the sample's mean over its views and `μ` the mean of the `μ_x`,

  .. math::
     \Sigma_b = \frac{1}{n-1}\sum_x (\mu_x - \mu)(\mu_x - \mu)^\top, \quad
     \Sigma_w = \frac{1}{n(q-1)}\sum_x\sum_i (e_{xi} - \mu_x)(e_{xi} - \mu_x)^\top + \delta I,

     \Sigma_{\text{LiDAR}} = \Sigma_w^{-1/2}\,\Sigma_b\,\Sigma_w^{-1/2}, \qquad
     \mathrm{LiDAR} = \exp\Big(-\sum_k p_k \log p_k\Big), \quad
     p_k = \frac{\lambda_k}{\|\lambda\|_1} + \epsilon

  where `λ_k` are the eigenvalues of `Σ_LiDAR`. It counts the directions in which samples are
  told apart better than their own views are: invariant to any invertible linear map of the
  embedding (up to `δ`), so a temperature that only stretches the spectrum does not move it.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from tfcl_jax.evaluation import label_free
    >>> centres = 10.0 * jax.random.normal(jax.random.key(0), (64, 1, 4))
    >>> views = centres + jax.random.normal(jax.random.key(1), (64, 8, 4))
    >>> 3.5 < label_free.lidar(views).item() <= 4.0  # four separated directions
    True

  Args:
    views: `[n, q, D]` float embeddings: `q >= 2` views of each of `n >= 2` samples.
    delta: the ridge `δ > 0` on `Σ_w` (keyword-only), `1e-4` as in Thilak et al.
    epsilon: `ε > 0` in the entropy (keyword-only), `1e-8` as in Thilak et al.

  Returns:
    A float32 (float64 under x64 inputs) scalar in `[1, min(n - 1, D)]` (up to `ε`).

  References:
    Thilak, Huang, Saremi, Dinh, Goh, Nakkiran, Susskind & Littwin, LiDAR: Sensing Linear
    Probing Performance in Joint Embedding SSL Architectures, ICLR 2024.
  """
  views = jnp.asarray(views)
  if not jnp.issubdtype(views.dtype, jnp.floating):
    raise TypeError(f"views must have a floating dtype, got {views.dtype}.")
  if views.ndim != 3 or views.shape[0] < 2 or views.shape[1] < 2:
    raise ValueError("views must have shape [n, q, D] with n >= 2 samples and q >= 2 views, "
                     f"got shape {views.shape}.")
  _checks.positive_scalar(delta, name="delta")
  _checks.positive_scalar(epsilon, name="epsilon")
  views = views.astype(_checks.compute_dtype(views.dtype))
  n, q, d = views.shape
  sample_means = jnp.mean(views, axis=1)
  between = sample_means - jnp.mean(sample_means, axis=0)
  sigma_b = between.T @ between / (n - 1)
  within = (views - sample_means[:, None]).reshape(n * q, d)
  sigma_w = within.T @ within / (n * (q - 1)) + delta * jnp.eye(d, dtype=views.dtype)
  w_values, w_vectors = jnp.linalg.eigh(sigma_w)
  inverse_sqrt = (w_vectors / jnp.sqrt(w_values)) @ w_vectors.T
  discriminant = inverse_sqrt @ sigma_b @ inverse_sqrt
  # Symmetrised before eigvalsh: rounding leaves the product a hair off symmetric.
  values = jnp.linalg.eigvalsh(0.5 * (discriminant + discriminant.T))
  return _entropy_rank(jnp.maximum(values, 0.0), epsilon)


def view_retrieval_top1(first: jax.typing.ArrayLike, second: jax.typing.ArrayLike) -> jax.Array:
  r"""Held-out view-to-view retrieval: the fraction of samples whose second view finds its own
  first view first among all first views, by cosine similarity.

  .. math:: \text{top-1} = \frac{1}{N}\sum_{i=1}^{N}
            \big[\arg\max_j \cos(\text{second}_i, \text{first}_j) = i\big]

  No labels: the task the contrastive loss trains, scored on samples it did not train on. A
  ranking, so it does not move with a rescaling of the similarities (a temperature) itself.
  Ties go to the lower index (collapsed embeddings score `1/N`).

  Examples:
    >>> import jax.numpy as jnp
    >>> from tfcl_jax.evaluation import label_free
    >>> first = jnp.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    >>> label_free.view_retrieval_top1(first, first + 0.1).item()
    1.0

  Args:
    first: `[N, D]` float embeddings of the first views.
    second: `[N, D]` float embeddings of the second views; row `i` is sample `i`'s.

  Returns:
    A float32 scalar in `[0, 1]`.
  """
  first = _matrix(first, name="first")
  second = _matrix(second, name="second")
  if first.shape != second.shape:
    raise ValueError(f"first and second must have the same shape [N, D], got {first.shape} and "
                     f"{second.shape}.")
  similarity = losses.l2_normalize(second) @ losses.l2_normalize(first).T
  found = jnp.argmax(similarity, axis=1) == jnp.arange(first.shape[0])
  return jnp.mean(found.astype(jnp.float32))


def scores(embeddings: jax.typing.ArrayLike, first: jax.typing.ArrayLike,
           second: jax.typing.ArrayLike, *, views: jax.typing.ArrayLike | None = None
           ) -> dict[str, jax.Array]:
  """Every label-free score of one held-out set, with each score's published constants.

  `rankme`, `alpha_req` and `uniformity` of `embeddings` (the representation the downstream
  metric reads); `alignment` and `view_top1` (`view_retrieval_top1`) of the two views; `lidar`
  of `views` when given.

  Examples:
    >>> import jax
    >>> from tfcl_jax.evaluation import label_free
    >>> z = jax.random.normal(jax.random.key(0), (256, 8))
    >>> sorted(label_free.scores(z, z, z))
    ['alignment', 'alpha_req', 'rankme', 'uniformity', 'view_top1']

  Args:
    embeddings: `[N, D]` float representation of the held-out samples (`N >= 3`; `D >= 7`
      for α-ReQ's fit from rank 6).
    first: `[M, D']` float embeddings of each held-out sample's first view.
    second: `[M, D']` its second views.
    views: optional `[n, q, D'']` embeddings of `q` views of each of `n` samples (LiDAR).

  Returns:
    `{name: float32 scalar}`.
  """
  out = {"rankme": rankme(embeddings), "alpha_req": alpha_req(embeddings),
         "uniformity": uniformity(embeddings), "alignment": alignment(first, second),
         "view_top1": view_retrieval_top1(first, second)}
  if views is not None:
    out["lidar"] = lidar(views)
  return out
