"""Launchers: the exact commands each prints with --dry-run, bad input as one line, and sweeps' tables."""

import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from headspec import launch
from headspec.errors import UserError
from headspec.launch import sweeps

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def dry(*argv, env=None, module=("headspec.launch",)):
  """(exit code, stdout, stderr) of `python -m headspec.launch ... --dry-run` in the repo (with
  module=("headspec", "launch"): `headspec launch ...`, the console script's form)."""
  done = subprocess.run(
    [sys.executable, "-m", *module, *argv],
    cwd=REPO,
    capture_output=True,
    text=True,
    env={**os.environ, "HEADSPEC_DATA_DIR": "/data", **(env or {})},
    timeout=60,
  )
  return done.returncode, done.stdout, done.stderr


def commands(out: str) -> list[tuple[str, list[str]]]:
  lines = out.strip().splitlines()
  return [(lines[i].removeprefix("# host: "), shlex.split(lines[i + 1])) for i in range(0, len(lines), 2)]


def test_local_any_command_and_two_processes():
  code, out, _ = dry(
    "local", "--dry-run", "--processes=2", "--", "train", "--config=configs/quickstart.py", "--workdir=r"
  )
  assert code == 0
  (h0, c0), (h1, c1) = commands(out)
  assert (h0, h1) == ("local process 0 of 2", "local process 1 of 2")
  assert "JAX_PROCESS_ID=0" in c0 and "JAX_PROCESS_ID=1" in c1 and "JAX_NUM_PROCESSES=2" in c0
  port = [a for a in c0 if a.startswith("JAX_COORDINATOR_ADDRESS=")]
  assert port and port[0].startswith("JAX_COORDINATOR_ADDRESS=127.0.0.1:") and port[0] in c1
  assert c0[-6:] == [
    "-m",
    "headspec",
    "train",
    "--config=configs/quickstart.py",
    "--workdir=r",
    "--config.multihost=True",
  ]
  code, out, _ = dry(
    "local", "--dry-run", "--processes=2", "--", "probe", "--config=configs/probe_ewt.py", "--workdir=r"
  )
  assert code == 0 and [h for h, _ in commands(out)] == ["local process 0 of 2", "local process 1 of 2"]  # one program
  assert all(c[-1] == "--config.multihost=True" for _, c in commands(out))
  code, out, _ = dry("local", "--dry-run", "--processes=2", "--", "atlas", "--workdir=r")  # no JAX: one process
  assert (
    code == 0
    and [h for h, _ in commands(out)] == ["local"]
    and commands(out)[0][1][-3:] == ["headspec", "atlas", "--workdir=r"]
  )


def test_pipeline_is_train_then_every_analysis_at_every_kept_step():
  code, out, _ = dry(
    "multi-gpu",
    "--dry-run",
    "--pipeline",
    "--config=configs/base_decoder.py",
    "--workdir=runs/s",
    "--",
    "--config.train.steps=100",
  )
  assert code == 0
  cmds = [c for _, c in commands(out)]
  assert [c[c.index("headspec") + 1] for c in cmds] == ["train", "probe", "diversity", "attention", "ablate"]
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.9" in cmds[0]
  assert cmds[0][-3:] == ["--workdir=runs/s", "--config.train.steps=100", "--config.model.dtype=bfloat16"]
  assert "--config.probe.steps=all" in cmds[1] and all("--config.steps=all" in c for c in cmds[2:])
  assert all("--workdir=runs/s" in c for c in cmds)


def test_slurm_sweep_is_a_job_array_with_signal_and_requeue():
  code, out, _ = dry(
    "slurm", "--dry-run", "--nodes=2", "--gpus-per-node=4", "--grid=train.regularizers.drophead=0,0.1", "--seeds=0,1",
    "--config=configs/base_decoder.py", "--workdir=/shared/dh",
  )  # fmt: skip
  assert code == 0
  for line in (
    "#SBATCH --nodes=2",
    "#SBATCH --array=0-3",
    "#SBATCH --signal=B:USR1@120",
    "#SBATCH --requeue",
    "#SBATCH --gpus-per-node=4",
  ):
    assert line in out.splitlines(), line
  assert "scontrol requeue" in out and 'kill -TERM "$step_pid"' in out
  trains = [line.split() for line in out.splitlines() if "headspec train" in line]
  assert len(trains) == 4
  first = trains[0]
  assert first[:5] == ["run", "srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
  assert "--workdir=/shared/dh/drophead=0,seed=0" in first and "--config.multihost=True" in first
  assert "--config.train.regularizers.drophead=0" in first and "--config.seed=0" in first
  assert "--workdir=/shared/dh/drophead=0.1,seed=1" in trains[3]
  assert out.count("python -m headspec.launch.sweeps summarize /shared/dh") == 4


def test_tpu_creates_installs_a_wheel_stages_data_and_runs_on_every_worker():
  code, out, _ = dry(
    "tpu", "--dry-run", "--create", "--accelerator-type=v4-16", "--runtime-version=tpu-ubuntu2204-base",
    "--data=gs://b/data", "--pipeline", "--analyses=probe", "--config=configs/base_decoder.py", "--workdir=gs://b/run",
    env={"TPU_NAME": "pod", "ZONE": "us-central2-b"},
  )  # fmt: skip
  assert code == 0, _
  steps = commands(out)
  assert steps[0][1][:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "pod"]
  assert "--accelerator-type=v4-16" in steps[0][1]
  assert steps[1][1][-6:] == ["wheel", "--no-deps", "-q", "-w", "dist", "."]
  remote = {h: [] for h, _ in steps}
  for host, cmd in steps:
    remote[host].append(next((a.removeprefix("--command=") for a in cmd if a.startswith("--command=")), ""))
  every = remote["every TPU worker"]
  wheel = f"headspec-{importlib.metadata.version('headspec')}-py3-none-any.whl"  # what `pip wheel .` writes
  assert any(f"dist/{wheel}" in cmd for _, cmd in steps if "scp" in cmd)
  assert any(f"pip install -q -U 'jax[tpu]' ~/headspec/{wheel}" in c for c in every)
  assert any("gcloud storage rsync --recursive gs://b/data ~/headspec/data" in c for c in every)
  train = [c for c in every if "headspec train" in c][0]
  assert (
    "--workdir=gs://b/run" in train
    and "--config.multihost=True" in train
    and "HEADSPEC_DATA_DIR=~/headspec/data" in train
  )
  assert "git clone" not in out
  probe = [c for c in every if "headspec probe" in c]  # analyses too are one program over the slice
  assert len(probe) == 1 and "--config.multihost=True" in probe[0] and "bfloat16" not in probe[0]
  assert "TPU worker 0" not in remote


@pytest.mark.parametrize(
  "argv, env, message",
  [
    (["tpu", "--dry-run", "--", "train", "--config=configs/base_decoder.py", "--workdir=gs://b/r"], {"TPU_NAME": "", "ZONE": ""}, "needs --tpu-name"),
    (["tpu", "--dry-run", "--create", "--data=gs://b/d", "--", "train"], {"TPU_NAME": "t", "ZONE": "z"}, "--accelerator-type"),
    (["local", "--dry-run", "--grid=train.nope=1,2", "--config=configs/base_decoder.py", "--workdir=x"], {}, "unknown config key 'train.nope'"),
    (["local", "--dry-run", "--", "train", "--config=configs/base_decoder.py", "--workdir=ftp://h/run"], {}, "unknown URL scheme ftp://"),
    (["slurm", "--grid=seed=1", "--config=configs/base_decoder.py", "--workdir=hdfs://x"], {}, "unknown URL scheme hdfs://"),
    (["nowhere"], {}, "invalid choice"),
  ],
)  # fmt: skip
def test_bad_input_is_one_line_and_starts_nothing(tmp_path, argv, env, message):
  code, out, err = dry(*argv, env=env)
  assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err, err
  assert not os.path.exists(os.path.join(REPO, "dist", "never")) and not (tmp_path / "x").exists()


@pytest.mark.parametrize(
  "argv",
  [
    ["local", "--dry-run", "--", "train", "--config=configs/quickstart.py", "--workdir=gs://b/run"],
    ["local", "--dry-run", "--processes=2", "--", "train", "--config=configs/quickstart.py", "--workdir=r"],
    ["slurm", "--dry-run", "--nodes=2", "--pipeline", "--config=configs/base_decoder.py", "--workdir=/shared/s"],
    ["local", "--dry-run", "--study", "--config=configs/base_decoder.py", "--workdir=s"],
    ["nowhere"],
    ["local", "--dry-run", "--", "probe", "--config=configs/probe_ewt.py", "--workdir=ftp://h/run"],
  ],
)  # fmt: skip
def test_headspec_launch_is_the_module_form(argv):
  """`headspec launch ARGS` prints what `python -m headspec.launch ARGS` prints (ports aside: each
  picks a free one), fails the same way (one line, exit 2), and leaves the CLI's XLA_FLAGS alone."""
  port = lambda text: re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)
  env = {"XLA_FLAGS": ""}
  code, out, err = dry(*argv, env=env, module=("headspec", "launch"))
  want_code, want_out, want_err = dry(*argv, env=env)
  assert (code, port(out), err) == (want_code, port(want_out), want_err)
  if code:
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and err.startswith("headspec launch: error:")
  else:
    assert out.startswith("# host: ")


def test_headspec_launch_in_process(capsys):
  from headspec.cli import main as cli

  assert cli.main(["headspec", "launch", "local", "--dry-run", "--", "atlas", "--workdir=r"]) == 0
  assert commands(capsys.readouterr().out)[0][1][-3:] == ["headspec", "atlas", "--workdir=r"]
  assert cli.main(["headspec", "launch"]) == 2
  assert capsys.readouterr().err.strip().splitlines() == [
    "headspec launch: error: the following arguments are required: target"
  ]
  assert cli.main(["headspec", "--verbose", "launch", "local"]) == 2  # launch's options are its own
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "launch comes first" in err[0]


def test_sweep_names_table_and_summary(tmp_path):
  from headspec.cli.quickstart import quickstart_config

  runs = sweeps.expand(
    quickstart_config("decoder"), sweeps.parse_grid(["train.regularizers.drophead=0,0.2"], "3"), tmp_path
  )
  assert [r.name for r in runs] == ["drophead=0,seed=3", "drophead=0.2,seed=3"]
  sweeps.write_plan(tmp_path, runs)
  os.makedirs(runs[1].workdir)
  with open(os.path.join(runs[1].workdir, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": 5, "loss": 2.5}) + "\n" + json.dumps({"step": 5, "eval/loss": 2.75}) + "\n")
  table = sweeps.summarize(tmp_path).read_text().splitlines()
  assert table[0] == "name,workdir,overrides,step,loss,eval_loss"
  assert table[2].endswith(",5,2.500000,2.750000") and table[1].endswith(",,,")
  with pytest.raises(UserError, match="unknown config key"):
    sweeps.expand(quickstart_config("decoder"), [("model.nope", ["1"])], tmp_path)


def test_build_raises_user_error_in_process():
  with pytest.raises(UserError, match="nothing to run"):
    launch.build(["local"])


def test_study_is_the_deprecated_name_of_pipeline():
  """`--study` plans what `--pipeline` plans and says once, on stderr, that it is now `--pipeline`."""
  argv = ["--config=configs/base_decoder.py", "--workdir=runs/s"]
  code, out, err = dry("local", "--dry-run", "--study", *argv)
  want_code, want_out, want_err = dry("local", "--dry-run", "--pipeline", *argv)
  assert (code, out, want_code, want_err) == (0, want_out, 0, "")
  assert err.splitlines() == ["headspec launch: warning: --study is deprecated: use --pipeline"]


def test_wheel_name_follows_the_package_version(monkeypatch):
  """The TPU steps install the wheel `pip wheel .` builds from this source: headspec.__version__, not a
  name written into the launcher."""
  import headspec

  monkeypatch.setattr(headspec, "__version__", "9.8.7")
  assert launch.wheel_name() == "headspec-9.8.7-py3-none-any.whl"
  _, steps, _ = launch.build(["tpu", "--tpu-name=t", "--zone=z", "--data=/d", "--", "atlas", "--workdir=gs://b/r"])
  assert [s.argv[-1] for s in steps if "pip install" in s.argv[-1]] == [
    "--command=pip install -q -U 'jax[tpu]' ~/headspec/headspec-9.8.7-py3-none-any.whl"
  ]


def test_a_renamed_config_resolves_by_its_former_name(tmp_path, monkeypatch):
  """configs/induction_study.py is now configs/induction.py ("study" is the specialization study's word): the
  old name and path still load it, from any directory and through the launcher."""
  from headspec import configs

  monkeypatch.chdir(tmp_path)
  new = str(configs.DIR / "induction.py")
  assert "induction_study" not in configs.names() and "induction" in configs.names()
  for old in ("induction_study", "induction_study.py", "configs/induction_study.py"):
    assert configs.resolve(f"{old}:seed=1") == f"{new}:seed=1"
  assert configs.resolve("elsewhere/induction_study.py") == "elsewhere/induction_study.py"  # not ours
  assert launch.plan.load_config("configs/induction_study.py:seed=3").seed == 3


def _analysis_seeds(plans) -> dict[tuple[str, str], str | None]:
  """{(workdir, analysis): the --config.seed it gets, or None}, over every stage of `plans`."""
  out = {}
  for stage in [s for p in plans for s in p]:
    argv = list(stage.args[stage.args.index("--") + 1 :] if stage.args[0] == "@stage" else stage.args)
    workdir = next((a.split("=", 1)[1] for a in argv if a.startswith("--workdir=")), "")
    seeds = [a.split("=", 1)[1] for a in argv if a.startswith("--config.seed=")]
    out[(workdir, argv[0])] = seeds[-1] if seeds else None
  return out


def test_each_run_analyses_with_its_own_seed_unless_the_seed_is_fixed():
  """Seeds must vary what the intervals over seeds claim to cover (control labels, the probe's train
  subsample, bootstrap resamples, SAE init), so probe/ablate/sae of the run with seed s get --config.seed=s;
  `fixed_analysis_seed` (experiments) and --fixed-analysis-seed (pipelines, sweeps) keep the config's seed."""
  spec = "configs/experiments/grammar.py:condition=baseline"
  opts = launch.args.parser().parse_args(["local", f"--experiment={spec}", "--workdir=root"])
  got = _analysis_seeds(launch.plan.experiment_plans(opts, []))
  for seed in (0, 1):
    run = f"root/baseline_s{seed}"
    assert got[(run, "probe")] == got[(run, "ablate")] == str(seed)
    assert got[(run, "diversity")] is None and got[(run, "atlas")] is None  # not seeded analyses
  assert got[("root/baseline_s0", "train")] is None  # training takes its seed from its own config
  opts = launch.args.parser().parse_args(["local", f"--experiment={spec},fixed_analysis_seed", "--workdir=root"])
  assert launch.plan.load_experiment(f"{spec},fixed_analysis_seed").runs == launch.plan.load_experiment(spec).runs
  fixed = _analysis_seeds(launch.plan.experiment_plans(opts, []))
  assert fixed.keys() == got.keys() and all(v is None for (_, c), v in fixed.items() if c != "study")
  argv = ["local", "--pipeline", "--analyses=probe,ablate,diversity", "--seeds=0,1"]
  argv += ["--config=configs/base_decoder.py", "--workdir=sw"]
  opts, rest = launch.args.parse(argv)
  got = _analysis_seeds(launch.plan.plan_runs(opts, rest)[0])
  assert (
    [got[(f"sw/seed={s}", "probe")] for s in (0, 1)] == ["0", "1"] == [got[(f"sw/seed={s}", "ablate")] for s in (0, 1)]
  )
  assert got[("sw/seed=1", "diversity")] is None
  opts, rest = launch.args.parse([*argv, "--fixed-analysis-seed"])
  assert all(v is None for (_, c), v in _analysis_seeds(launch.plan.plan_runs(opts, rest)[0]).items() if c != "train")
