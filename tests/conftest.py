"""Test setup: 2 fake CPU devices (set before JAX starts) and the data directory of the real-data tests."""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=2"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No persistent compilation cache in the suite: jaxlib 0.10.2's CPU backend segfaulted serializing a
# program it had just compiled, to write it to the cache (put_executable_and_time), taking a pytest worker
# with it (docs/testing.md). The workers get no cache folder; the `headspec` commands that tests start
# inherit HEADSPEC_COMPILATION_CACHE=0. The tests of the cache itself (test_cli_help.py, the compile-cache
# benchmark) set their own.
os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
os.environ["HEADSPEC_COMPILATION_CACHE"] = "0"

import http.server  # noqa: E402
import pathlib  # noqa: E402

import pytest  # noqa: E402

# What the real-data tests read: treebank -> splits (UD r2.16, the release the development data matches).
TEST_TREEBANKS = {"en_ewt": ("train", "dev", "test"), "en_gum": ("dev", "test")}


def data_cache() -> pathlib.Path:
  """Where the tests fetch the treebanks when HEADSPEC_DATA_DIR is unset: ~/.cache/headspec/data."""
  return pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "headspec" / "data"


def _missing(path: pathlib.Path) -> list[str]:
  return [
    f"ud/{tb}/{tb}-ud-{split}.conllu"
    for tb, splits in TEST_TREEBANKS.items()
    for split in splits
    if not (path / "ud" / tb / f"{tb}-ud-{split}.conllu").is_file()
  ]


def fetch_command(path) -> str:
  return (
    f"export HEADSPEC_DATA_DIR={path}; headspec data download ud en_ewt && "
    f"headspec data download ud en_gum --splits=dev,test"
  )


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
  """HEADSPEC_DATA_DIR (CI: the development data), which must hold the test treebanks; when it is unset,
  ~/.cache/headspec/data, filled once through headspec's UD downloader. Fails (never skips) with one
  line naming the command that gets the data."""
  configured = os.environ.get("HEADSPEC_DATA_DIR")
  path = pathlib.Path(configured or data_cache())
  missing = _missing(path)
  if missing and configured:
    pytest.fail(f"HEADSPEC_DATA_DIR={path} lacks {missing[0]}; run: {fetch_command(path)}", pytrace=False)
  if missing:
    import fcntl  # POSIX; imported only where the tests fetch

    from headspec.data.download import download_ud
    from headspec.errors import UserError

    path.mkdir(parents=True, exist_ok=True)
    with open(path / ".tests-fetch.lock", "w") as lock:  # pytest-xdist workers fetch once, one at a time
      fcntl.flock(lock, fcntl.LOCK_EX)
      failure = None
      try:
        for treebank, splits in TEST_TREEBANKS.items():
          if any(m.startswith(f"ud/{treebank}/") for m in _missing(path)):
            download_ud(treebank, path, splits=splits, log=lambda _: None)
      except UserError as e:
        failure = str(e)
    if failure:
      pytest.fail(
        f"no test treebanks in {path}, fetching failed ({failure}); run: {fetch_command(path)}", pytrace=False
      )
    if _missing(path):
      pytest.fail(f"{path} lacks {_missing(path)[0]} after fetching; run: {fetch_command(path)}", pytrace=False)
  return path


def _run_shared(tmp_path_factory) -> pathlib.Path:
  """This test run's folder that both pytest-xdist workers see (the parent of each worker's own)."""
  base = tmp_path_factory.getbasetemp()
  return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


def _made_once(tmp_path_factory, name: str, make) -> pathlib.Path:
  """`shared/name`, made by `make(folder)` by the first worker that asks (under a lock; the other waits and
  reads it): deterministic inputs are built once per test run, not once per worker or module."""
  import fcntl
  import shutil

  shared = _run_shared(tmp_path_factory)
  out = shared / name
  with open(shared / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not out.is_dir():
      tmp = shared / f"{name}.partial"
      shutil.rmtree(tmp, ignore_errors=True)
      make(tmp)
      tmp.rename(out)
  return out


@pytest.fixture(scope="session")
def synthetic_data_dir(tmp_path_factory) -> pathlib.Path:
  """A small synthetic treebank + text corpus (headspec/data/synthetic.py), written once per test run."""
  from headspec.data.synthetic import write_synthetic

  make = lambda out: write_synthetic(out, num_train=600, num_dev=150, num_test=150, num_text_sentences=6000)
  return _made_once(tmp_path_factory, "synthetic", make)


@pytest.fixture(scope="session")
def train_tiny_decoder(synthetic_data_dir, tmp_path_factory):
  """`train(steps, keep_steps, name)` -> the run directory of a 2-layer, 4-head decoder (d_model 32, rows of
  32 tokens) trained on the synthetic text, with checkpoints at `keep_steps` and the last step.

  Each (steps, keep_steps) is trained once per test run (training is deterministic); every caller gets its
  own copy under `name`, so a test may write into its run."""
  import shutil

  from headspec.cli.quickstart import quickstart_config
  from headspec.train.loop import train_and_evaluate

  def make(steps, keep_steps, workdir):
    c = quickstart_config("decoder")
    c.data_dir = str(synthetic_data_dir)
    c.data.vocab_size = 512
    c.model.num_layers, c.model.num_heads, c.model.d_model, c.model.d_head, c.model.d_ff = 2, 4, 32, 8, 64
    c.train.steps, c.train.batch_size, c.train.seq_len = steps, 8, 32
    c.train.eval_every = c.train.diversity_every = 0
    c.train.checkpoint_every = 100
    c.train.keep_steps = tuple(keep_steps)
    train_and_evaluate(c, workdir)

  def train(steps: int, keep_steps=(), name: str = "run") -> pathlib.Path:
    keep_steps = tuple(keep_steps)
    trained = _made_once(
      tmp_path_factory,
      f"tiny-decoder-{steps}-steps-keep-{'-'.join(map(str, keep_steps)) or 'none'}",
      lambda out: make(steps, keep_steps, out),
    )
    workdir = tmp_path_factory.mktemp("runs") / name
    shutil.copytree(trained, workdir)
    return workdir

  return train


@pytest.fixture(scope="session")
def attention_only_decoder(tmp_path_factory):
  """`get(num_layers)` -> tests/induction_recipe.py's trained attention-only decoder (seed 0, 1,500
  steps), trained once per test run: its parameters are written to the run's temporary folder, which
  both pytest-xdist workers share, under a lock, and the worker that did not train reads them."""
  import fcntl

  import induction_recipe
  import jax
  import numpy as np
  from flax import nnx

  shared = _run_shared(tmp_path_factory)

  def get(num_layers: int):
    path = shared / f"attention-only-{num_layers}-layers.npz"
    with open(shared / f"attention-only-{num_layers}-layers.lock", "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      if path.is_file():
        graphdef, params = induction_recipe.initial(num_layers)  # the structure; the values are read
        leaves, treedef = jax.tree.flatten(params)
        with np.load(path) as saved:
          params = jax.tree.unflatten(treedef, [saved[f"a{i}"] for i in range(len(leaves))])
      else:
        graphdef, params = induction_recipe.train_attention_only(num_layers)
        np.savez(path, **{f"a{i}": np.asarray(a) for i, a in enumerate(jax.tree.leaves(params))})
    return nnx.merge(graphdef, params)

  return get


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
  def log_message(self, *args):
    pass


@pytest.fixture()
def server(tmp_path):
  """(base_url, served folder): an HTTP server on 127.0.0.1 in a thread (no network), for the downloaders."""
  import functools
  import threading

  root = tmp_path / "served"
  root.mkdir()
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
  threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
  yield f"http://127.0.0.1:{httpd.server_address[1]}", root
  httpd.shutdown()
  httpd.server_close()


def pytest_collection_modifyitems(config, items):
  """The modules that hold a test marked `slow` run first, each module's tests kept together (their
  module-scoped fixtures are built once): the long tests start at the beginning and the short ones fill in
  behind them, instead of a long test starting last while the other pytest-xdist worker idles."""
  slow_modules = {item.module for item in items if item.get_closest_marker("slow")}
  # A module that reads the shared attention-only decoder after the first one (which trains it) goes to the
  # end of its section, so that it finds the model written instead of waiting for the training.
  sharing = [item.module for item in items if "attention_only_decoder" in getattr(item, "fixturenames", ())]
  readers = set(sharing) - set(sharing[:1])
  items.sort(key=lambda item: (item.module not in slow_modules, item.module in readers))


# The compile record: with HEADSPEC_COMPILE_RECORD=FILE set, each pytest worker appends one JSON line per test
# to FILE.<worker> — the XLA programs that test compiled in the worker's process and their compile seconds
# (jax's backend-compile event; commands a test starts as subprocesses are not counted). A count of programs
# does not depend on the machine's load, so it is what the suite's speed work is judged by;
# `python -m benchmarks.slowest_tests --compiles=FILE` sums it (docs/testing.md).
_COMPILES = {"programs": 0, "seconds": 0.0}


def _count_compile(event: str, seconds: float, **_) -> None:
  if event == "/jax/core/compile/backend_compile_duration":
    _COMPILES["programs"] += 1
    _COMPILES["seconds"] += seconds


def pytest_configure(config):
  if os.environ.get("HEADSPEC_COMPILE_RECORD"):
    from jax import monitoring

    monitoring.register_event_duration_secs_listener(_count_compile)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  record = os.environ.get("HEADSPEC_COMPILE_RECORD")
  before = dict(_COMPILES)
  yield
  if record:
    import json

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = {
      "test": item.nodeid,
      "programs": _COMPILES["programs"] - before["programs"],
      "seconds": round(_COMPILES["seconds"] - before["seconds"], 3),
    }
    with open(f"{record}.{worker}", "a") as f:
      f.write(json.dumps(line) + "\n")
