"""The probing protocols as their papers run them: Hewitt & Manning's regimen.py
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


# --- item 9: one λ for a task and its control (Hewitt & Liang 2019) ---


def _softmax_case(seed=0):
  """x_NGK (2 groups) with an imbalanced but decodable task (a strong penalty shrinks it to the majority
  class: the task's best λ is the weakest) and a control of labels unrelated to x, 90% one class (the
  strongest penalty predicts that class and is as good as any: its λ is the strongest)."""
  rng = np.random.default_rng(seed)
  n = 3000
  x = rng.normal(size=(n, 2, 8)).astype(np.float32)
  x[:, 1] = x[:, 0] + 0.3 * x[:, 1]  # the second group: a noisier copy of the first
  score = x[:, :, :3] @ np.array([[3.0, 0, 0], [0, 3.0, 0], [0, 0, 3.0]])
  y = np.where(score.max(-1)[:, 0] > 2.5, 1 + score.argmax(-1)[:, 0], 0).astype(np.int32)  # ~70% class 0
  control = np.where(rng.random(n) < 0.9, 0, rng.integers(1, 4, n)).astype(np.int32)
  return x, y, control


def test_tied_lambda_fits_the_control_at_the_tasks_lambda():
  from headspec.probing import probe

  x, y, control = _softmax_case()
  tr, dv = slice(0, 2000), slice(2000, None)
  specs = [probe.ProbeSpec("t", 4, y[tr], y[dv]), probe.ProbeSpec("t/control", 4, control[tr], control[dv])]
  kw = dict(l2_grid=(1e-4, 1e-2, 3.0), refine_samples=4096, seed=0)
  separate = probe.fit_softmax_probes(x[tr], x[dv], specs, **kw)
  assert (separate.l2["t/control"] != separate.l2["t"]).all()  # the case: the choices differ in every group
  tied = probe.fit_softmax_probes(x[tr], x[dv], specs, choose_with={"t/control": "t"}, **kw)
  np.testing.assert_array_equal(tied.l2["t/control"], tied.l2["t"])
  np.testing.assert_array_equal(tied.l2["t"], separate.l2["t"])  # the task's own choice is unchanged
  np.testing.assert_array_equal(tied.weights["t"], separate.weights["t"])
  index = np.searchsorted(tied.l2_grid, tied.l2["t"])
  np.testing.assert_array_equal(tied.dev_accuracy_best["t/control"], tied.dev_accuracy["t/control"][[0, 1], index])
  with pytest.raises(structural.UserError, match="choose_with"):
    probe.fit_softmax_probes(x[tr], x[dv], specs, choose_with={"t/control": "nope"}, **kw)


def test_control_lambda_config_tied_by_default_separate_as_option():
  """tasks.fit_softmax under `probe.control_lambda`: probes/fits.csv's `l2` of the control is the task's by
  default, its own with 'separate'; a bad value is one line from the config check."""
  import types

  from headspec.errors import UserError
  from headspec.probing import plan, tasks
  from headspec.probing.config import probe_config

  x, y, control = _softmax_case(1)
  split = lambda s: types.SimpleNamespace(labels={"upos": y[s]}, controls={"upos": control[s]})
  data = types.SimpleNamespace(
    train=split(slice(0, 2000)),
    tune=split(slice(2000, None)),
    vocab={"upos": tasks.Vocabulary(list("abcd"), np.bincount(y[:2000], minlength=4))},
  )
  config = probe_config()
  config.probe.l2_grid, config.probe.refine_samples = (1e-4, 1e-2, 3.0), 4096
  l2 = {}
  for mode in ("tied", "separate"):
    config.probe.control_lambda = mode
    fitted = tasks.fit_softmax([tasks.REGISTRY["upos"]], x[:2000], x[2000:], data, config)["upos"]
    l2[mode] = {(r["group"], r["probe"]): r["l2"] for r in tasks.fit_rows("upos", fitted)}
  assert probe_config().probe.control_lambda == "tied"
  for g in (0, 1):
    assert l2["tied"][(g, "control")] == l2["tied"][(g, "task")] == l2["separate"][(g, "task")]
    assert l2["separate"][(g, "control")] != l2["separate"][(g, "task")]
  config.probe.control_lambda = "both"
  with pytest.raises(UserError, match="probe.control_lambda='both'"):
    plan.check_config(config)


def test_arc_control_at_given_lambdas():
  from headspec.errors import UserError
  from headspec.probing import arc

  rng = np.random.default_rng(2)
  trees = test_structural._trees(rng, 40, lengths=(3, 10))
  heads = [np.asarray(t.heads, np.int32) for t in trees]
  x = rng.normal(size=(sum(map(len, heads)), 2, 8)).astype(np.float32)
  kw = dict(rank=4, l2_grid=(1e-4, 1e-2, 1.0), epochs=1, train_uas=False)
  given = np.array([1.0, 1e-4], np.float32)
  fitted = arc.fit_arc_probes(x, heads, x, heads, l2_G=given, **kw)
  np.testing.assert_array_equal(fitted.l2_G, given)
  np.testing.assert_array_equal(fitted.dev_uas_G, fitted.dev_uas_GP[[0, 1], [2, 0]])
  with pytest.raises(UserError, match="l2_G"):
    arc.fit_arc_probes(x, heads, x, heads, l2_G=np.array([0.5, 1.0]), **kw)


# --- item 12: the summary never ranks on the split it reports without saying so ---


def test_summary_refuses_a_group_without_its_dev_row():
  import test_probe_suite

  from headspec.errors import UserError
  from headspec.probing import report

  row = lambda layer, head, split, acc, control: test_probe_suite._summary_row("m", layer, head, split, acc, control)
  rows = [row(0, 0, "t/dev", 0.6, 0.2), row(0, 0, "t/test", 0.5, 0.3), row(0, 1, "t/test", 0.9, 0.1)]
  with pytest.raises(UserError, match="task upos, L0H1: a `t/test` row but no `t/dev` row"):
    report.summary(rows, [], "t/test", top_k=2, select_split="t/dev")
  structural_rows = [
    dict(model="m", step="0", task="distance", layer="0", head=h, split=s, metric="uuas", value="0.5",
         ci_low="0.4", ci_high="0.6", control_value="0.3", selectivity="0.2", rank="8", n="10")
    for h, s in (("0", "t/dev"), ("0", "t/test"), ("-1", "t/test"))
  ]  # fmt: skip
  with pytest.raises(UserError, match="task distance, layer 0 residual"):
    report.structural_summary(structural_rows, [], "t/test", "t/dev", top_k=2)


def test_summary_says_when_it_ranks_on_the_reported_split():
  """No dev rows at all (dev not among probe.eval_splits): ranked on test, and the summary says so, where
  it used to rank on test silently."""
  import test_probe_suite

  from headspec.probing import report

  row = lambda layer, head, acc, control: test_probe_suite._summary_row("m", layer, head, "t/test", acc, control)
  rows = [row(0, 0, 0.5, 0.3), row(0, 1, 0.9, 0.1), row(0, -1, 0.8, 0.4), row(1, -1, 0.7, 0.4)]
  text = report.summary(rows, [], "t/test", top_k=2, select_split="t/dev")
  assert "**upos: no `t/dev` rows, so ranked on `t/test` itself**" in text
  assert "best residual layer (chosen on t/test) 0" in text and "(chosen on dev)" not in text
  assert text.index("| 0 | 1 | 0.900") < text.index("| 0 | 0 | 0.500")  # by test selectivity, as the note says
  structural_rows = [
    dict(model="m", step="0", task="distance", layer="0", head=h, split="t/test", metric="uuas", value=v,
         ci_low="0.4", ci_high="0.6", control_value="0.3", selectivity="0.2", rank="8", n="10")
    for h, v in (("0", "0.5"), ("1", "0.6"))
  ]  # fmt: skip
  text = report.structural_summary(structural_rows, [], "t/test", "t/dev", top_k=1)
  assert "m step 0, uuas: **distance: no `t/dev` rows" in text and "| L0H1 | 0.600" in text
