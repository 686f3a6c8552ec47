"""headspec.diversity.metrics: known answers, a float64 NumPy reference (plain loops), streaming, the model."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from headspec.diversity import metrics as diversity

L, B, T, H, K, D = 2, 3, 5, 3, 4, 6


def random_batch(rng, b=B, causal=False, z_offset=0.0):
  """Random intermediates with padding at the end of some sequences; probs zero off the support."""
  lengths = rng.integers(2, T + 1, size=b)
  lengths[0] = T
  valid = np.arange(T)[None, :] < lengths[:, None]
  supp = valid[:, None, :] & (np.tril(np.ones((T, T), bool))[None] if causal else True)
  logits = rng.normal(size=(L, b, H, T, T)) * 2
  logits = np.where(supp[None, :, None], logits, -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs = np.nan_to_num(probs / probs.sum(-1, keepdims=True))  # fully padded rows: 0/0 -> 0 (not counted)
  probs[:, :, :, ~valid.any(0)] = 0.0
  return dict(
    q_LBTHK=rng.normal(size=(L, b, T, H, K)),
    pattern_LBHTS=probs,
    z_LBTHK=rng.normal(size=(L, b, T, H, K)) + z_offset,
    head_out_LBTHD=rng.normal(size=(L, b, T, H, D)),
  ), valid


def to_jax(arrays):
  return {k: jnp.asarray(v, jnp.float32) for k, v in arrays.items()}


def mean_squared_canonical_correlation(X, Y):
  """Σρ²/min(rank) for centred X, Y: ρ = singular values of Q_xᵀ Q_y (Björck & Golub 1973), by SVD.

  As in headspec: columns scaled to unit norm, then the principal directions whose squared singular
  value is above 1e-5 × the largest span each side."""
  bases = []
  for A in (X, Y):
    u, s, _ = np.linalg.svd(A / np.linalg.norm(A, axis=0), full_matrices=False)
    bases.append(u[:, s**2 > 1e-5 * s[0] ** 2])  # orthonormal basis of A's (retained) column space
  rho = np.linalg.svd(bases[0].T @ bases[1], compute_uv=False)
  return np.sum(rho**2) / min(b.shape[1] for b in bases)


def numpy_reference(x, valid, causal):
  """Every metric from its definition, in float64, with explicit loops."""
  q, probs, z, out = (np.asarray(x[k], np.float64) for k in ("q_LBTHK", "pattern_LBHTS", "z_LBTHK", "head_out_LBTHD"))
  nl, nb, nt, nh, _ = q.shape
  tokens = [(b, t) for b in range(nb) for t in range(nt) if valid[b, t]]
  cos = lambda a, c: float(a @ c / (np.linalg.norm(a) * np.linalg.norm(c)))
  res = {name: np.zeros((nl, nh, nh)) for name in diversity.PAIR_METRICS}
  res.update({name: np.zeros((nl, nh)) for name in diversity.HEAD_METRICS})
  for l in range(nl):
    for i, j in itertools.product(range(nh), range(nh)):
      res["query_orthogonality"][l, i, j] = np.mean([cos(q[l, b, t, i], q[l, b, t, j]) ** 2 for b, t in tokens])
      res["context_nonorthogonality"][l, i, j] = np.mean([cos(z[l, b, t, i], z[l, b, t, j]) ** 2 for b, t in tokens])
      res["output_dissimilarity"][l, i, j] = -np.mean([cos(out[l, b, t, i], out[l, b, t, j]) for b, t in tokens])
      res["output_nonorthogonality"][l, i, j] = np.mean([cos(out[l, b, t, i], out[l, b, t, j]) ** 2 for b, t in tokens])
      js = []
      for b, t in tokens:
        p, r = probs[l, b, i, t], probs[l, b, j, t]
        m = (p + r) / 2
        kl = lambda a, m=m: sum(a[s] * math.log2(a[s] / m[s]) for s in range(nt) if a[s] > 0)
        js.append(math.sqrt(max(0.5 * kl(p) + 0.5 * kl(r), 0.0)))
      res["js_distance"][l, i, j] = np.mean(js)
      X = np.stack([z[l, b, t, i] for b, t in tokens])
      Y = np.stack([z[l, b, t, j] for b, t in tokens])
      X, Y = X - X.mean(0), Y - Y.mean(0)
      res["linear_cka"][l, i, j] = np.linalg.norm(Y.T @ X) ** 2 / (np.linalg.norm(X.T @ X) * np.linalg.norm(Y.T @ Y))
      res["context_cca"][l, i, j] = mean_squared_canonical_correlation(X, Y)
      Xq = np.stack([q[l, b, t, i] for b, t in tokens])
      Yq = np.stack([q[l, b, t, j] for b, t in tokens])
      res["query_cca"][l, i, j] = mean_squared_canonical_correlation(Xq - Xq.mean(0), Yq - Yq.mean(0))
    for h in range(nh):
      var, ent, dist = [], [], []
      for b, t in tokens:
        support = [s for s in range(nt) if valid[b, s] and (not causal or s <= t)]
        a = probs[l, b, h, t]
        var.append(np.var(a[support]))
        ent.append(-sum(a[s] * math.log(a[s]) for s in support if a[s] > 0))
        dist.append(sum(a[s] * abs(t - s) for s in range(nt)))
      res["attention_variance"][l, h] = np.mean(var)
      res["attention_entropy"][l, h] = np.mean(ent)
      res["attention_distance"][l, h] = np.mean(dist)
  return res


@pytest.mark.parametrize("causal", [False, True])
def test_matches_numpy_reference(causal):
  x, valid = random_batch(np.random.default_rng(0), causal=causal)
  got = diversity.compute(to_jax(x), jnp.asarray(valid), causal=causal)
  want = numpy_reference(x, valid, causal)
  assert set(got) == set(diversity.METRICS)
  for name in diversity.METRICS:
    np.testing.assert_allclose(np.asarray(got[name]), want[name], rtol=2e-4, atol=2e-5, err_msg=name)


def test_streaming_over_three_batches_equals_concatenated():
  rng = np.random.default_rng(1)
  batches = [random_batch(rng, b=b, z_offset=30.0) for b in (2, 3, 2)]  # large mean: tests stable centring
  state = diversity.init(L, H, K)
  for x, valid in batches:
    state = diversity.update_jit(state, *to_jax(x).values(), jnp.asarray(valid))
  streamed = diversity.finalize(state)
  x_all = {k: np.concatenate([x[k] for x, _ in batches], axis=1) for k in batches[0][0]}
  valid_all = np.concatenate([v for _, v in batches])
  whole = diversity.compute(to_jax(x_all), jnp.asarray(valid_all))
  for name in diversity.METRICS:  # `compute` itself is checked against NumPy in test_matches_numpy_reference
    np.testing.assert_allclose(np.asarray(streamed[name]), np.asarray(whole[name]), rtol=1e-4, atol=1e-5, err_msg=name)


def test_identical_heads_are_maximally_similar_and_cka_is_rotation_invariant():
  rng = np.random.default_rng(2)
  x, valid = random_batch(rng)
  for key in ("q_LBTHK", "z_LBTHK", "head_out_LBTHD"):
    x[key] = np.repeat(x[key][:, :, :, :1], H, axis=3)
  x["pattern_LBHTS"] = np.repeat(x["pattern_LBHTS"][:, :, :1], H, axis=2)
  rotation, _ = np.linalg.qr(rng.normal(size=(K, K)))
  x["z_LBTHK"][:, :, :, 2] = 3.0 * x["z_LBTHK"][:, :, :, 0] @ rotation  # same head, other basis and scale
  m = diversity.compute(to_jax(x), jnp.asarray(valid))
  ones = np.ones((L, H, H))
  np.testing.assert_allclose(m["query_orthogonality"], ones, rtol=1e-5)
  np.testing.assert_allclose(m["output_dissimilarity"], -ones, rtol=1e-5)
  np.testing.assert_allclose(m["js_distance"], 0 * ones, atol=1e-6)
  np.testing.assert_allclose(m["linear_cka"], ones, rtol=1e-4)
  np.testing.assert_allclose(m["query_cca"], ones, rtol=1e-4)
  np.testing.assert_allclose(m["context_cca"], ones, rtol=1e-4)
  np.testing.assert_allclose(m["context_nonorthogonality"][:, 0, 1], 1.0, rtol=1e-5)
  assert np.all(np.asarray(m["context_nonorthogonality"][:, 0, 2]) < 0.99)  # cosine is not rotation invariant


def test_orthogonal_outputs_have_zero_cosine():
  x, valid = random_batch(np.random.default_rng(3))
  out = np.zeros((L, B, T, H, D))
  for h in range(H):
    out[:, :, :, h, 2 * h : 2 * h + 2] = np.random.default_rng(h).normal(size=(L, B, T, 2))  # disjoint coordinates
  x["head_out_LBTHD"] = out
  m = np.asarray(diversity.compute(to_jax(x), jnp.asarray(valid))["output_dissimilarity"])
  np.testing.assert_allclose(m * (1 - np.eye(H)), np.zeros((L, H, H)), atol=1e-7)
  np.testing.assert_allclose(np.diagonal(m, axis1=1, axis2=2), -1.0, rtol=1e-6)


def test_uniform_attention_has_max_entropy_and_zero_variance():
  x, _ = random_batch(np.random.default_rng(4))
  valid = np.ones((B, T), bool)
  x["pattern_LBHTS"] = np.full((L, B, H, T, T), 1.0 / T)
  m = diversity.compute(to_jax(x), jnp.asarray(valid))
  np.testing.assert_allclose(m["attention_entropy"], np.full((L, H), math.log(T)), rtol=1e-6)
  np.testing.assert_allclose(m["attention_variance"], np.zeros((L, H)), atol=1e-9)
  # causal uniform attention: query t spreads over t+1 keys
  causal_probs = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
  x["pattern_LBHTS"] = np.broadcast_to(causal_probs, (L, B, H, T, T))
  m = diversity.compute(to_jax(x), jnp.asarray(valid), causal=True)
  np.testing.assert_allclose(m["attention_entropy"], np.full((L, H), np.mean(np.log(np.arange(1, T + 1)))), rtol=1e-6)
  np.testing.assert_allclose(m["attention_variance"], np.zeros((L, H)), atol=1e-9)


def test_previous_token_pattern_has_distance_one_and_disjoint_heads_js_one():
  x, _ = random_batch(np.random.default_rng(5))
  valid = np.ones((B, T), bool)
  prev = np.eye(T, k=-1)
  prev[0, 1] = 1.0  # the first token looks at the next one: distance 1 too
  probs = np.zeros((L, B, H, T, T))
  probs[:, :, 0], probs[:, :, 1], probs[:, :, 2] = prev, np.eye(T), prev  # head 1 (self) is disjoint from prev
  x["pattern_LBHTS"] = probs
  m = diversity.compute(to_jax(x), jnp.asarray(valid))
  np.testing.assert_allclose(m["attention_distance"], np.tile([1.0, 0.0, 1.0], (L, 1)), rtol=1e-6)
  np.testing.assert_allclose(m["attention_entropy"], np.zeros((L, H)), atol=1e-7)
  js = np.asarray(m["js_distance"])
  np.testing.assert_allclose(js[:, 0, 1], 1.0, rtol=1e-6)
  np.testing.assert_allclose(js[:, 0, 2], 0.0, atol=1e-7)


def test_summarize_uses_off_diagonal_pairs():
  rng = np.random.default_rng(6)
  metrics = {"linear_cka": jnp.asarray(rng.random((L, H, H))), "attention_entropy": jnp.asarray(rng.random((L, H)))}
  s = diversity.summarize(metrics)
  for l in range(L):
    pairs = [float(metrics["linear_cka"][l, i, j]) for i in range(H) for j in range(H) if i != j]
    np.testing.assert_allclose(s["diversity/linear_cka/mean"][l], np.mean(pairs), rtol=1e-6)
    np.testing.assert_allclose(s["diversity/linear_cka/var"][l], np.var(pairs), rtol=1e-5)
    np.testing.assert_allclose(
      s["diversity/attention_entropy/var"][l], np.var(np.asarray(metrics["attention_entropy"][l])), rtol=1e-5
    )


def test_rows_follow_results_csv_contract():
  metrics = {"linear_cka": jnp.zeros((L, H, H)), "attention_entropy": jnp.ones((L, H))}
  table = diversity.rows(metrics, step=7)
  assert len(table) == L * H * H + L * H
  assert table[-1] == (7, L - 1, H - 1, -1, "attention_entropy", 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_runs_on_model_intermediates(kind):
  from flax import nnx

  from headspec.model.config import ModelConfig
  from headspec.model.transformer import Transformer

  cfg = ModelConfig(kind=kind, vocab_size=50, num_layers=2, num_heads=4, d_model=32, d_head=8, d_ff=64, max_len=16)
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(0), (2, 9), 0, 50)
  valid = jnp.arange(9)[None, :] < jnp.array([[9], [6]])
  _, inter = model(tokens, valid_BT=valid, capture=diversity.CAPTURE)
  m = diversity.compute(inter, valid, causal=kind == "decoder")
  as_numpy = {k: np.asarray(getattr(inter, k)) for k in ("q_LBTHK", "pattern_LBHTS", "z_LBTHK", "head_out_LBTHD")}
  want = numpy_reference(as_numpy, np.asarray(valid), causal=kind == "decoder")
  for name in diversity.METRICS:
    np.testing.assert_allclose(np.asarray(m[name]), want[name], rtol=1e-3, atol=1e-5, err_msg=name)


def test_a_new_metric_is_one_registry_entry(monkeypatch):
  """A toy metric (mean query norm per head) added as one `Metric` streams, finalizes and becomes table rows."""
  toy = diversity.Metric(
    "query_norm",
    "head",
    init=lambda L, H, K: {"sum": jnp.zeros((L, H))},
    batch=lambda b: {"sum": jnp.einsum("bth,bt->h", jnp.linalg.norm(b.q_BTHK, axis=-1), b.w_BT)},
    finalize=lambda sums, n: sums["sum"] / n,
    basis_dependent=False,
    doc="mean_t ||q_h(t)||",
  )
  monkeypatch.setitem(diversity.REGISTRY, toy.name, toy)
  rng = np.random.default_rng(7)
  batches = [random_batch(rng, b=b) for b in (2, 3)]
  state = diversity.init(L, H, K)
  for x, valid in batches:
    state = diversity.update_jit(state, *to_jax(x).values(), jnp.asarray(valid))
  got = diversity.finalize(state)
  q = np.concatenate([x["q_LBTHK"] for x, _ in batches], axis=1)
  valid = np.concatenate([v for _, v in batches])
  want = np.linalg.norm(q, axis=-1)[:, valid].mean(1)  # [L, H]: over valid tokens
  np.testing.assert_allclose(np.asarray(got["query_norm"]), want, rtol=1e-5)
  assert set(got) == set(diversity.METRICS) | {"query_norm"}
  assert sum(r[4] == "query_norm" for r in diversity.rows(got, step=0)) == L * H


def test_basis_free_metrics_are_unchanged_by_an_invertible_change_of_head_basis():
  """(W_V, W_O) is fixed only up to an invertible M per head (Z_h → Z_h M, W_O → M⁻¹ W_O) and (W_Q, W_K)
  likewise (q → q M): attention and Z_h W_O^h stay the same. A random INVERTIBLE (not orthogonal) M must
  leave every metric not marked basis_dependent unchanged, and change the basis-dependent ones."""
  from headspec.diversity import metrics as m

  rng = np.random.default_rng(0)
  L, B, T, H, K, D = 1, 2, 6, 3, 4, 8
  q = rng.standard_normal((L, B, T, H, K)).astype(np.float32)
  z = rng.standard_normal((L, B, T, H, K)).astype(np.float32)
  w_o = rng.standard_normal((H, K, D)).astype(np.float32)
  logits = rng.standard_normal((L, B, H, T, T))
  probs = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)
  valid = np.ones((B, T), bool)
  mix = rng.standard_normal((H, K, K)) + 2 * np.eye(K)  # invertible, far from orthogonal
  mix = mix * rng.uniform(0.2, 5.0, (H, 1, K))
  head_out = np.einsum("lbthk,hkd->lbthd", z, w_o)
  z2 = np.einsum("lbthk,hkj->lbthj", z, mix).astype(np.float32)
  w_o2 = np.einsum("hjk,hkd->hjd", np.linalg.inv(mix), w_o)
  head_out2 = np.einsum("lbthk,hkd->lbthd", z2, w_o2).astype(np.float32)
  q2 = np.einsum("lbthk,hkj->lbthj", q, mix).astype(np.float32)
  np.testing.assert_allclose(head_out2, head_out, rtol=1e-3, atol=1e-4)
  fields = ("q_LBTHK", "pattern_LBHTS", "z_LBTHK", "head_out_LBTHD")
  a = m.compute(dict(zip(fields, (q, probs, z, head_out.astype(np.float32)))), valid)
  b = m.compute(dict(zip(fields, (q2, probs, z2, head_out2))), valid)
  for name, metric in m.REGISTRY.items():
    if metric.basis_dependent:
      assert not np.allclose(a[name], b[name], atol=1e-3), name
    else:
      np.testing.assert_allclose(a[name], b[name], rtol=1e-3, atol=1e-4, err_msg=name)
  assert {n for n, x in m.REGISTRY.items() if x.basis_dependent} == {
    "query_orthogonality",
    "context_nonorthogonality",
    "linear_cka",
  }
