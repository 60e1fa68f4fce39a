"""How ranks count ties: against the target (the default) or for it, TensorFlow Recommenders'
`FactorizedTopK` rule, checked on a hand-computed catalogue and a NumPy transcription of it."""

import chex
import numpy as np
import pytest

from tfcl_jax.evaluation import ranking

# One query [1, 0]; item j scores SCORES[j] (small integers: the ties are exact).
SCORES = np.array([3.0, 2.0, 2.0, 2.0, 1.0, 0.0], np.float32)
QUERY = np.array([[1.0, 0.0]], np.float32)
ITEMS = np.stack([SCORES, np.zeros_like(SCORES)], axis=1)
TARGETS = np.arange(6)
# By hand: items other than the target scoring >= it (against) and > it (for).
AGAINST = [0, 3, 3, 3, 4, 5]
FOR = [0, 1, 1, 1, 4, 5]


class RankTiesTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_rank_all_counts_ties_against_or_for_the_target(self):
    def ranks(ties):
      rank = lambda q, c, t: ranking.rank_all(q, c, 0 * t, t, ties=ties, chunk_size=4)
      return self.variant(rank)(QUERY, ITEMS, TARGETS)

    np.testing.assert_array_equal(ranks("against"), AGAINST)
    np.testing.assert_array_equal(ranks("for"), FOR)

  def test_default_counts_ties_against_the_target(self):
    np.testing.assert_array_equal(
        ranking.rank_all(QUERY, ITEMS, np.zeros(6, int), TARGETS), AGAINST)
    np.testing.assert_array_equal(
        ranking.target_rank(np.array([2.0]), np.array([[3.0, 2.0, 2.0, 1.0]])), [3])

  def test_target_rank_counts_ties_for_the_target(self):
    np.testing.assert_array_equal(
        ranking.target_rank(np.array([2.0, 0.5]), np.array([[3.0, 2.0, 2.0, 1.0],
                                                             [0.5, 0.5, 0.5, 0.5]]), ties="for"),
        [1, 0])

  def test_hits_at_k_by_hand(self):
    # A target tied with two other items just below the top one: at k = 2 it is a hit for
    # TFRS (one score strictly above it) and a miss when ties count against it (three).
    against = ranking.hit_ratio_and_ndcg(np.array(AGAINST), ks=(1, 2, 4))
    tied_for = ranking.hit_ratio_and_ndcg(np.array(FOR), ks=(1, 2, 4))
    np.testing.assert_allclose([float(against[f"hr@{k}"]) for k in (1, 2, 4)],
                               [1 / 6, 1 / 6, 4 / 6], rtol=1e-6)
    np.testing.assert_allclose([float(tied_for[f"hr@{k}"]) for k in (1, 2, 4)],
                               [1 / 6, 4 / 6, 4 / 6], rtol=1e-6)

  def test_ties_for_equals_factorized_top_k(self):
    # NumPy transcription of FactorizedTopK's score-based update: the target's score placed
    # before the catalogue's K best scores (the target among them, as in the tutorial), a hit
    # at k where tf.math.in_top_k says so: fewer than k scores strictly above the target's.
    rng = np.random.default_rng(0)
    queries = rng.integers(-2, 3, (7, 3)).astype(np.float32)
    items = rng.integers(-2, 3, (50, 3)).astype(np.float32)  # integer scores: many ties
    users, targets = rng.integers(0, 7, 200), rng.integers(0, 50, 200)
    ks, top = (1, 5, 10, 20), 20
    scores = queries.astype(np.float64) @ items.T.astype(np.float64)
    hits = {k: [] for k in ks}
    for user, target in zip(users, targets, strict=True):
      positive = scores[user, target]
      predictions = np.concatenate([[positive], np.sort(scores[user])[::-1][:top]])
      for k in ks:
        hits[k].append(np.sum(predictions > positive) < k)
    ranks_for = ranking.rank_all(queries, items, users, targets, ties="for", chunk_size=64)
    ranks_against = ranking.rank_all(queries, items, users, targets, chunk_size=64)
    metrics = ranking.hit_ratio_and_ndcg(ranks_for, ks=ks)
    for k in ks:
      assert float(metrics[f"hr@{k}"]) == pytest.approx(np.mean(hits[k]))
    assert np.all(np.asarray(ranks_for) <= np.asarray(ranks_against))
    assert np.any(np.asarray(ranks_for) < np.asarray(ranks_against))  # the data do tie

  def test_unknown_rule_is_refused(self):
    with pytest.raises(ValueError, match="ties must be one of"):
      ranking.rank_all(QUERY, ITEMS, np.zeros(6, int), TARGETS, ties="random")
    with pytest.raises(ValueError, match="ties must be one of"):
      ranking.target_rank(np.array([1.0]), np.array([[1.0]]), ties="")
