"""The probing protocols as their papers run them (issue 61, items 9, 10, 12): Hewitt & Manning's regimen.py
for the structural probes (per-epoch shuffle, stopping after patience, torch's ReduceLROnPlateau), Hewitt &
Liang's one λ for a task and its control, and a summary that never ranks on the split it reports."""

import jax
import numpy as np
import pytest
import test_structural

from headspec.probing import structural

# --- item 10: Hewitt & Manning's regimen.py ---


def test_epoch_order_is_a_new_seeded_permutation_every_epoch():
  key = jax.random.PRNGKey(3)
  orders = [structural.epoch_order(key, epoch, 50) for epoch in range(1, 6)]
  for order in orders:
    assert sorted(order.tolist()) == list(range(50))
  assert len({tuple(o.tolist()) for o in orders}) == 5  # every epoch its own order
  np.testing.assert_array_equal(structural.epoch_order(jax.random.PRNGKey(3), 2, 50), orders[1])  # seeded
  assert structural.epoch_order(jax.random.PRNGKey(4), 2, 50).tolist() != orders[1].tolist()


def test_epoch_batches_take_consecutive_sentences_of_the_order():
  rng = np.random.default_rng(0)
  lengths_U = rng.integers(1, 40, size=90)
  lengths_U[[5, 17]] = (70, 130)  # longer than a row of 64: their own wider rows
  first_U = np.concatenate([[0], np.cumsum(lengths_U)[:-1]])
  order_U = rng.permutation(len(lengths_U))
  batches = list(structural.epoch_batches(lengths_U, order_U, batch_sentences=20, batch_words=512))
  seen = []
  for idx_BW, count in batches:
    assert idx_BW.shape[1] in (64, 128, 256) and idx_BW.shape[0] == max(1, 512 // idx_BW.shape[1])
    assert 1 <= count <= 20
    words = idx_BW[idx_BW >= 0]
    sentences = list(dict.fromkeys(np.searchsorted(first_U, words, side="right") - 1))
    assert len(sentences) == count
    for s in sentences:  # each sentence whole, in one row, its words in order
      row, col = np.argwhere(idx_BW == first_U[s])[0]
      np.testing.assert_array_equal(idx_BW[row, col : col + lengths_U[s]], first_U[s] + np.arange(lengths_U[s]))
    seen.append(sentences)
  assert sorted(s for b in seen for s in b) == list(range(len(lengths_U)))  # every sentence once an epoch
  narrow = [s for s in order_U if lengths_U[s] <= 64]
  position = {s: i for i, s in enumerate(narrow)}
  spans = [sorted(position[s] for s in b) for b in seen if lengths_U[b[0]] <= 64]
  assert [p for span in spans for p in span] == list(range(len(narrow)))  # runs of the epoch's order, in turn
  assert sum(c == 20 for _, c in batches) >= 3  # H&M's batches of 20 where they fit


def test_reduce_on_plateau_matches_torch():
  """The per-group schedule against torch.optim.lr_scheduler.ReduceLROnPlateau (H&M's: mode 'min', factor
  0.1, patience 0; torch's default relative threshold 1e-4) on summed dev losses, including improvements
  above 1e-4 absolute but below 1e-4 relative (no improvement for torch) and rates that stop at eps."""
  torch = pytest.importorskip("torch")
  sequences = [
    [1000.0, 990.0, 989.95, 989.0, 988.99, 980.0, 979.99, 979.98, 979.97, 979.96, 979.95, 900.0],
    [5.0, 4.0, 4.0, 3.0, 3.5, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 1.0],
    [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0],
  ]
  for patience in (0, 2):
    want = []
    for seq in sequences:
      opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
      sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.1, patience=patience)
      lrs = []
      for loss in seq:
        sched.step(loss)
        lrs.append(opt.param_groups[0]["lr"])
      want.append(lrs)
    if patience == 0:
      assert want[2][-1] == pytest.approx(1e-8)  # torch stops at eps: 1e-8 -> 1e-9 is not taken
    n = max(len(s) for s in sequences)
    loss_EG = np.array([s + [s[-1]] * (n - len(s)) for s in sequences]).T  # groups side by side
    lr, best, bad = np.full(3, 1e-3, np.float32), np.full(3, np.inf), np.zeros(3, np.int64)
    for e in range(n):
      lr, best, bad = structural.reduce_on_plateau(lr, best, bad, loss_EG[e], patience=patience)
      for g, seq in enumerate(sequences):
        if e < len(seq):
          assert lr[g] == pytest.approx(want[g][e], rel=1e-5), (patience, g, e)


def _two_groups(rng):
  """Group 0: features whose squared distances are the trees' (learnable); group 1: noise, whose dev loss
  stops improving within a few epochs."""
  train, dev = test_structural._trees(rng, 120, lengths=(3, 12)), test_structural._trees(rng, 30, lengths=(5, 12))
  mix = np.linalg.qr(rng.normal(size=(24, 16)))[0].T
  x = lambda trees: np.concatenate(
    [test_structural._embed(trees, mix), rng.normal(size=(sum(len(t.heads) for t in trees), 1, 24)).astype(np.float32)],
    axis=1,
  )
  return train, dev, x(train), x(dev)


def test_a_group_stops_after_patience_and_is_frozen():
  rng = np.random.default_rng(5)
  train, dev, x_train, x_dev = _two_groups(rng)
  kw = dict(kind="depth", rank=8, learning_rate=1e-2, batch_words=64, seed=1, patience=3)
  both = structural.fit_structural_probes(x_train, train, x_dev, dev, epochs=30, **kw)
  noise = 1
  stop, best = int(both.stopped_epoch_G[noise]), int(both.best_epoch_G[noise])
  assert both.converged_G[noise] and stop == best + 3 < both.epochs_run  # the other group trained on
  history = both.dev_loss_EG[:, noise]
  assert np.isfinite(history[:stop]).all() and np.isnan(history[stop:]).all()  # no epoch after it stopped
  assert (history[best:stop] >= both.dev_loss_G[noise] - 1e-4).all()  # its patience epochs: none better
  short = structural.fit_structural_probes(x_train, train, x_dev, dev, epochs=stop, **kw)
  assert short.best_epoch_G[noise] == best  # the epochs the other group trained on changed nothing of it
  np.testing.assert_array_equal(short.b_GKR[noise], both.b_GKR[noise])


def test_fit_shuffles_every_epoch():
  """The fit visits the sentences in epoch_order's permutation: another seed, another path."""
  rng = np.random.default_rng(6)
  train, dev, x_train, x_dev = _two_groups(rng)
  kw = dict(kind="distance", rank=8, learning_rate=1e-2, batch_words=64, epochs=2, patience=5)
  a, b = (structural.fit_structural_probes(x_train, train, x_dev, dev, seed=s, **kw) for s in (0, 0))
  np.testing.assert_array_equal(a.b_GKR, b.b_GKR)  # deterministic given the seed
  calls = []
  real = structural.epoch_order
  try:
    structural.epoch_order = lambda key, epoch, n: calls.append(real(key, epoch, n)) or calls[-1]
    structural.fit_structural_probes(x_train, train, x_dev, dev, seed=0, **kw)
  finally:
    structural.epoch_order = real
  assert len(calls) == 2 and calls[0].tolist() != calls[1].tolist()


def test_raw_features_by_default_and_std_as_option():
  rng = np.random.default_rng(7)
  train, dev, x_train, x_dev = _two_groups(rng)
  kw = dict(kind="depth", rank=8, batch_words=64, epochs=1)
  raw = structural.fit_structural_probes(x_train * 7.0, train, x_dev * 7.0, dev, **kw)
  assert raw.scale == "raw" and (raw.std_GK == 1).all()
  std = structural.fit_structural_probes(x_train * 7.0, train, x_dev * 7.0, dev, scale="std", **kw)
  np.testing.assert_allclose(std.std_GK, (x_train * 7.0).std(0), rtol=1e-4)
  with pytest.raises(structural.UserError, match="scale"):
    structural.fit_structural_probes(x_train, train, x_dev, dev, scale="centred", **kw)
